"""OSWorld's tasks judged by OSWorld's own code: the ``desktop-env`` package (PyPI) loaded one module at a time
(``package``), its evaluators run against our desktops through the VM-server API ``retrace guest`` speaks.

docs/osworld.md says which version was measured and what runs here."""
