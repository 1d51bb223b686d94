"""What crosses a process boundary, and nothing else: the broker protocol (``protocol.py``: version, envelope, one
encode/decode pair; ``requests.py`` and ``replies.py``: each request's arguments and reply as typed structs),
records as rows (``codec.py``; ``columns.py``; ``row_checks.py``: the broker's check of rows from outside), the
tensor kinds the codec learns from ``tensors/`` (``tensor_kinds.py``), and the socket helpers (``zsocket.py``).
It imports nothing from the rest of the library: ``tensors/``, ``client/`` and ``broker/`` build on it."""
