"""The paper's experiments beyond RQ2, on the same desktops, agents and judges as a recovery: a forward episode
(``forward``: an agent solves a task from its initial state) and how one is kept on disk (``trajectory``:
OSWorld's results layout, which ``retrace build`` reads back as on-policy rollouts)."""
