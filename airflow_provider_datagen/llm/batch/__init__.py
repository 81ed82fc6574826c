"""The model step's batch mode: the providers' batch APIs behind core/batch/protocol.py's ``BatchClient``."""
