"""A user model that fails inside the run with a message full of HTML, so the write-up's
failed rows and their escaping are tested on a real error record."""

from __future__ import annotations

import torch

from tests.fixtures.models import Bigram

MESSAGE = 'boom <script>alert("x")</script> & <b>bold</b>'


class _RaisingHtml(Bigram):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.device.type != "meta":  # the parent's meta-device check passes, the run fails
            raise RuntimeError(MESSAGE)
        return super().forward(ids)


def raising_html(config) -> torch.nn.Module:
    return _RaisingHtml(config.vocab_size, config.context_length)
