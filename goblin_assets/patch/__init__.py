"""Changing the user's program: the change set a set of rules asks for, the places that set a
lever again, and one writer per format that edits the user's own file (``propose``)."""
