"""One module per subcommand. Each parses options and makes one library call and one render."""
