"""``persisting.loader``: the documented path of ``StreamingDataset`` (it lives in ``persisting.client.loader``;
importing it needs torch)."""

from .client.loader import StreamingDataset

__all__ = ["StreamingDataset"]
