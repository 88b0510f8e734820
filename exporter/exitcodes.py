"""Exit codes every command shares: 0 done, 1 failed at run time (a peer, a file), 2 bad usage or config."""

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
