"""persist-queue's serializers (same module names, same functions, same bytes): pickle (the default), json,
msgpack, cbor2. They run in the client process only: the broker stores the bytes and never decodes them."""
