"""Convert verl fully-async launch scripts into asyncrl run files (`asyncrl import verl`)."""
