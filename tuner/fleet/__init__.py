"""Commands for a fleet of machines: `ci` (tune, report and pack a per-machine artifact)
and `check` (does an artifact belong on this host, and is it still faster)."""
