"""The session: owns one of each stage, opens and closes it, assembles stats(), signals, fork."""
