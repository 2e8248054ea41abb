"""The Tinker-compatible training API (docs/tinker.md): its wire format, records and sessions."""
