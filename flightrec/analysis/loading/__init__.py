"""Loading: find dump files, read each one as deep as the analysis needs, pick one view per rank."""
