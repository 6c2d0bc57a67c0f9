"""Import a recording of RLlib's offline recorder: its rows, step numbers and repeats."""
