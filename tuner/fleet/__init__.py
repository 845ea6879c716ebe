"""Commands for a fleet of machines: `ci` (tune, report and pack a per-machine artifact),
`check` (does an artifact belong on this host, and is it still faster) and `verify` (a
profile's library checked against the reference, under qemu-user for another
architecture)."""
