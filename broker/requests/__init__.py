"""The broker's requests: ``table.py`` maps each operation to its handler and its argument and reply structs
(persisting/wire/requests.py, replies.py); the handlers live here by concept (records, samples, take, the arena's
tensor puts, keyed samples, spooled batches, the broker itself), ``reads.py`` is the data reply they share."""
