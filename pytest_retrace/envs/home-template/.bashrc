# A prompt without host name, user or directory: identical on every machine and worker.
PS1='$ '
HISTFILE=
