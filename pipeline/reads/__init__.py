"""Reading an episode dataset: check, fingerprint and count it, hand it to Ray Data, derive
``returns``.
"""
