"""Import a Minari dataset: its episodes (T+1 rows each) as canonical transitions."""
