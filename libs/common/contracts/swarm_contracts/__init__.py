"""Swarm's public contracts: the pydantic models and names every service and the SDK share.

pydantic only: no broker, store or telemetry code lives here (that is ``swarm_runtime``), so
``pip install swarm-sdk`` stays light.
"""
