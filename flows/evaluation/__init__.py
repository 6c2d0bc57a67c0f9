"""Stage 3 of a run, evaluation on held-out tasks: query losses, rollouts and the pictures
stored with every published version.
"""
