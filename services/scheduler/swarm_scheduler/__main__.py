import gc
import logging

import uvloop

from swarm_scheduler.app import build_app
from swarm_scheduler.settings import SchedulerSettings


def main() -> None:
    settings = SchedulerSettings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    app = build_app(settings)

    @app.after_startup
    async def freeze_startup_heap() -> None:
        # What start-up made (modules, the rebuilt view) lives as long as the process: out of
        # the garbage collector's full passes, which otherwise paused the scheduler 60-100 ms
        # every second under load (docs/performance.md).
        gc.freeze()

    # uvloop: the scheduler's cost is per message, and a good part of it was the event loop.
    uvloop.run(app.run())


if __name__ == "__main__":
    main()
