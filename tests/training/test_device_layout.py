"""On an accelerator the trainer works out each batch's packing on the host, from the CPU mask, before the forward:
the model then reads `batch.layout` instead of asking the device where the real tokens are."""

from __future__ import annotations

import torch

from bertology.model import EncoderModel, HeadSpec, Layout, preset
from bertology.objectives.clm import lm_batch
from bertology.objectives.mlm import MaskedLM
from bertology.training.config import OptimConfig, RunConfig, SpeedConfig, TrainConfig
from bertology.training.trainer import Trainer


class OneBatch:
    def __init__(self, batch):
        self.batch = batch

    def num_batches(self, epoch, batch_size, rank=0, world_size=1, drop_last=True):
        return 1

    def batches(self, epoch, batch_size, start_batch=0, rank=0, world_size=1, drop_last=True):
        yield self.batch


def test_batches_moved_to_an_accelerator_carry_their_packing(tmp_path):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    batch = lm_batch(torch.randint(1, 50, (3, 4)) * mask, mask)
    model = EncoderModel(preset("tiny", vocab_size=50), [HeadSpec("mlm", "masked_lm")])
    config = TrainConfig(optim=OptimConfig(batch_size=3, total_steps=1), run=RunConfig(output_dir=str(tmp_path)),
                         speed=SpeedConfig(device="cpu", threads=1, prefetch=0))
    trainer = Trainer(config, model, [MaskedLM()], OneBatch(batch))
    assert trainer._device_batch(batch) is batch  # on the CPU nothing moves and nothing is added
    trainer.device = torch.device("meta")  # stands in for a GPU: tensors move, nothing is computed
    moved = trainer._device_batch(batch)
    expected = Layout(mask)
    assert moved.input_ids.device.type == "meta" and moved.layout.flat_index.device.type == "meta"
    assert moved.layout.groups == expected.groups and moved.layout.max_seqlen == expected.max_seqlen == 4
    assert model.forward_inputs(moved)["layout"] is moved.layout
    # the encoder given the packing gives what it computes from the mask itself
    with torch.no_grad():
        model.eval()
        inputs = {**model.forward_inputs(batch), "layout": expected}
        assert torch.equal(model(**inputs).head_logits["mlm"], model(**model.forward_inputs(batch)).head_logits["mlm"])


def test_decoder_and_encoder_decoder_batches_carry_their_packings(tmp_path):
    """A causal LM's packing includes its packed documents; an encoder-decoder's decoder side gets one too. Given
    them, the models compute what they compute from the masks themselves."""
    from bertology.data.seq2seq import seq2seq_batch
    from bertology.model.transformer import DecoderModel, Seq2SeqModel
    from bertology.objectives.clm import CausalLM
    from transformer_helpers import tiny_config

    torch.manual_seed(0)
    torch.set_num_threads(1)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0]])
    documents = torch.tensor([[0, 0, 1, 1, 1, -1], [2, 2, 2, 3, 3, 3], [4, 4, -1, -1, -1, -1]])
    ids = torch.randint(3, 50, (3, 6)) * mask
    target_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    cases = [(DecoderModel(tiny_config(), CausalLM().heads()), lm_batch(ids, mask, documents), CausalLM()),
             (Seq2SeqModel(tiny_config(), [HeadSpec("lm", "tied_lm")]),
              seq2seq_batch(ids, mask, torch.randint(3, 50, (3, 3)) * target_mask, target_mask, 0), None)]
    for model, batch, objective in cases:
        model.init_weights(torch.Generator().manual_seed(0))
        config = TrainConfig(optim=OptimConfig(batch_size=3, total_steps=1), run=RunConfig(output_dir=str(tmp_path)),
                             speed=SpeedConfig(device="cpu", threads=1, prefetch=0))
        trainer = Trainer(config, model, [objective or MaskedLM()], OneBatch(batch))
        trainer.device = torch.device("meta")
        moved = trainer._device_batch(batch)
        inputs = model.forward_inputs(moved)
        assert inputs["layout"] is moved.layout and moved.layout.flat_index.device.type == "meta"
        on_host = {"layout": Layout(mask, getattr(batch, "documents", None))}
        if isinstance(model, Seq2SeqModel):
            assert inputs["decoder_layout"] is moved.decoder_layout
            on_host["decoder_layout"] = Layout(batch.decoder_attention_mask)
        assert moved.layout.groups == on_host["layout"].groups
        with torch.no_grad():
            model.eval()
            given = model(**{**model.forward_inputs(batch), **on_host}).logits
            assert torch.equal(given, model(**model.forward_inputs(batch)).logits)
