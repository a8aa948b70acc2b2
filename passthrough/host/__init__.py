"""Reading hosts: a root directory (live, snapshot, fixture) or pyudev on a live host."""
