"""NEXMark benchmark: the standard auction-site events, generator, queries and runner."""
