"""What runs in a user's shell: `carbonsched VERB` (`main`), the verbs' shared helpers and
registry (`common`), the verb modules (`carbon`, `report`, `simulate`), the API socket
client (`client`) and the human-readable tables (`output`).

Nothing outside this package imports it (a test walks the imports); it may import the
daemon and node packages, whose processes `carbonsched daemon` and `carbonsched agent` start.
"""
