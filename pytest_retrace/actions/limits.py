"""Caps on what one action, one turn (one model reply) and one reply's text may ask: the Action type and every
dialect parser read them here.

Models are untrusted: a reply asking for more is an invalid action, the agent's failure, never a hung desktop.
The caps keep every accepted action well inside an environment's own time limits (xvfb types 40 characters a
second and scrolls 30 wheel clicks a second).
"""

MAX_TEXT_CHARS = 2000  # characters typed by one action (~50 s at xvfb's typing speed)
MAX_SCROLL = 100  # wheel clicks per axis in one action
MAX_KEYS = 16  # keys named in one action
MAX_PRESSES = 100  # key presses in one action (presses x keys)
MAX_WAIT = 60.0  # seconds one wait action may ask
MAX_HOLD = 10.0  # seconds a chord may be held (Claude's hold_key)
# ... and on one turn (one model reply), whatever its dialect: the parsers stop reading a reply at
# MAX_TURN_ACTIONS (bounding their work), and the replay checks every turn before running it.
MAX_TURN_ACTIONS = 200
MAX_TURN_WAIT = 120.0  # seconds of waiting and holding, summed over the turn's actions
MAX_REPLY_CHARS = 100_000  # a whole model reply (reasoning included) read by a dialect parser
# Largest magnitude of any number a model or a case file may write: far beyond any coordinate, duration or
# count, and small enough that scaling it, converting it to float or printing it can never overflow.
MAX_NUMBER = 10**9
