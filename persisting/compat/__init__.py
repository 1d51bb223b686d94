"""Drop-in layers that give other queue libraries' APIs persisting's engine (see ``persistqueue``)."""
