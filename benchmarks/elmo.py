"""ELMo's training step: bertology's ElmoModel against a plain torch.nn implementation of the same model.

    python benchmarks/elmo.py                       # CPU, the elmo-tiny sizes
    python benchmarks/elmo.py --device cuda --size released

The plain implementation is what one writes with torch.nn: with clipping (the released model clips its cell at 3
and its projected state at 3), AllenNLP's cell, `nn.Linear` input, state and projection layers stepped word by word
per direction and layer, with clamps (no fused LSTM can clip the cell the next step reads); without clipping,
`nn.LSTM(proj_size=...)` per direction and layer. Both share the character CNN's weights and compute the same loss
on the same batches (checked: the losses agree to float rounding). A step: truncated-backpropagation windows of W
words for both directions (batch B), the forward and backward LM losses through the full softmax, backward, no
optimizer.

One JSON line per configuration: words/s of each and the ratio.

    python benchmarks/elmo.py --embed               # embed's word vectors: ELMo against a BERT of similar size

`--embed` times `embed(levels=("word",), layers="mean")` over Brown sentences (../shared/data/brown-nltk) for the
elmo-tiny model (clipping on: inference keeps the fused kernel's run where no clip bites) and a BERT encoder of
about the same parameters without its embedding and softmax tables (3 layers of 192), WordPiece trained on the same
sentences; both random weights (speed does not depend on them, except for which LSTM path the clips allow)."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

from bertology.model.elmo import ElmoConfig, ElmoModel, tiny_config
from bertology.model.heads import HeadSpec


class PlainBiLM(nn.Module):
    """The same biLM on torch.nn's LSTMs, its weights copied from an ElmoModel."""

    def __init__(self, ours: ElmoModel) -> None:
        super().__init__()
        config = ours.config
        self.config, self.characters, self.softmax, self.head = config, ours.characters, ours.softmax, ours.heads["lm"]
        self.clipped = config.clipped
        self.directions = nn.ModuleList()
        for layers in (ours.forward_layers, ours.backward_layers):
            stack = nn.ModuleList()
            for layer in layers:
                if self.clipped:  # AllenNLP's LSTM cell with projection: linear layers stepped per word
                    parts = nn.ModuleDict({"input": nn.Linear(layer.input_size, 4 * config.cell_size, bias=False),
                                           "state": nn.Linear(config.projection_dim, 4 * config.cell_size),
                                           "projection": nn.Linear(config.cell_size, config.projection_dim,
                                                                   bias=False)})
                    with torch.no_grad():
                        parts["input"].weight.copy_(layer.weight_ih)
                        parts["state"].weight.copy_(layer.weight_hh)
                        parts["state"].bias.copy_(layer.bias)
                        parts["projection"].weight.copy_(layer.weight_hr)
                    stack.append(parts)
                else:
                    lstm = nn.LSTM(layer.input_size, config.cell_size, proj_size=config.projection_dim,
                                   batch_first=True)
                    with torch.no_grad():
                        lstm.weight_ih_l0.copy_(layer.weight_ih)
                        lstm.weight_hh_l0.copy_(layer.weight_hh)
                        lstm.bias_ih_l0.copy_(layer.bias)
                        lstm.bias_hh_l0.zero_()
                        lstm.weight_hr_l0.copy_(layer.weight_hr)
                    stack.append(lstm)
            self.directions.append(stack)

    def run_layer(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return layer(x)[0]
        batch = x.shape[0]
        h = x.new_zeros(batch, self.config.projection_dim)
        c = x.new_zeros(batch, self.config.cell_size)
        outputs = []
        for t in range(x.shape[1]):
            i, f, g, o = (layer["input"](x[:, t]) + layer["state"](h)).chunk(4, 1)
            c = (torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)).clamp(-self.config.cell_clip,
                                                                                 self.config.cell_clip)
            h = layer["projection"](torch.sigmoid(o) * torch.tanh(c)).clamp(-self.config.proj_clip,
                                                                            self.config.proj_clip)
            outputs.append(h)
        return torch.stack(outputs, 1)

    def forward(self, chars, targets, back_chars, back_targets):
        tops = []
        for d, (ids, stack) in enumerate(((chars, self.directions[0]), (back_chars, self.directions[1]))):
            x = self.characters(ids.flatten(0, 1)).view(*ids.shape[:2], -1)
            if d == 1:
                x = x.flip(1)
            for index, layer in enumerate(stack):
                y = self.run_layer(layer, x)
                x = y + x if index > 0 and self.config.skip_connections else y
            tops.append(x if d == 0 else x.flip(1))
        return sum(F.cross_entropy(F.linear(top.flatten(0, 1), self.softmax.weight, self.head.bias),
                                   t.flatten(), reduction="sum") for top, t in zip(tops, (targets, back_targets)))


def ours_loss(model: ElmoModel, chars, targets, back_chars, back_targets):
    out = model(chars, backward_input_ids=back_chars)
    return sum(F.cross_entropy(model.lm_logits(top).flatten(0, 1), t.flatten(), reduction="sum")
               for top, t in ((out.forward_top, targets), (out.backward_top, back_targets)))


def timed(step, repeats: int, device: torch.device) -> float:
    step()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def embed_speed(args: argparse.Namespace) -> None:
    from pathlib import Path

    from bertology.data.corpus import read_documents
    from bertology.embeddings import embed
    from bertology.model import EncoderModel, preset
    from bertology.tokenization import train_tokenizer

    sentences = [s for d in read_documents([str(Path("../shared/data/brown-nltk"))], "brown") for s in d]
    texts = sentences[:args.texts]
    tokenizer = train_tokenizer(iter(sentences[:20000]), "wordpiece", 8000, show_progress=False)
    elmo = ElmoModel(tiny_config(projection_dim=128, cell_size=512, dropout=0.0)).eval()
    elmo.init_weights(torch.Generator().manual_seed(0))
    bert = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, hidden_size=192, num_layers=3, num_heads=3,
                               intermediate_size=768, max_position_embeddings=512)).eval()
    bert.init_weights(torch.Generator().manual_seed(0))

    def count(module: nn.Module, skip: tuple[str, ...]) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(skip))

    runners = {"elmo": lambda: embed(elmo, texts, layers="mean", levels=("word",), batch_size=32),
               "bert": lambda: embed(bert, texts, tokenizer=tokenizer, layers="mean", levels=("word",),
                                     batch_size=32)}
    words = len(runners["elmo"]().words.strings)
    times = {name: timed(run, args.repeats, torch.device("cpu")) for name, run in runners.items()}
    print(json.dumps({"texts": len(texts), "words": words,
                      "elmo_params": count(elmo, ("softmax",)),
                      "bert_params": count(bert, ("encoder.embeddings.word",)),
                      "elmo_words_per_s": round(words / times["elmo"]),
                      "bert_words_per_s": round(words / times["bert"]),
                      "x_bert": round(times["bert"] / times["elmo"], 2)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("tiny", "released"), default="tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embed", action="store_true", help="time embed on ELMo and on a BERT of similar size")
    parser.add_argument("--texts", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.embed:
        embed_speed(args)
        return
    device = torch.device(args.device)
    for clip in (3.0, None):
        if args.size == "tiny":
            config = tiny_config(vocab_size=args.vocab, projection_dim=128, cell_size=512, dropout=0.0,
                                 cell_clip=clip, proj_clip=clip)
        else:
            config = ElmoConfig(vocab_size=args.vocab, dropout=0.0, cell_clip=clip, proj_clip=clip)
        model = ElmoModel(config, [HeadSpec("lm", "tied_lm_bias")])
        model.init_weights(torch.Generator().manual_seed(0))
        plain = PlainBiLM(model)
        model.to(device).train()
        plain.to(device).train()
        g = torch.Generator().manual_seed(1)
        words = torch.randint(1, 257, (args.batch * 2, args.window, config.max_characters_per_token), generator=g)
        lengths = torch.randint(2, 12, (args.batch * 2, args.window, 1), generator=g)
        positions = torch.arange(config.max_characters_per_token)
        words = torch.where(positions < lengths, words, 261)
        words[..., 0] = 259
        words.scatter_(2, lengths, 260)
        chars, back = words[:args.batch].to(device), words[args.batch:].to(device)
        targets = torch.randint(0, args.vocab, (2, args.batch, args.window), generator=g).to(device)
        batch = (chars, targets[0], back, targets[1])
        with torch.no_grad():
            a, b = ours_loss(model, *batch), plain(*batch)
        assert torch.allclose(a, b, rtol=1e-4), (float(a), float(b))

        def step(module, fn):
            def run():
                loss = fn(*batch)
                loss.backward()
                module.zero_grad(set_to_none=True)
            return run

        ours_s = timed(step(model, lambda *x: ours_loss(model, *x)), args.repeats, device)
        plain_s = timed(step(plain, plain), args.repeats, device)
        words_per_step = 2 * args.batch * args.window
        print(json.dumps({"size": args.size, "clip": clip, "device": str(device), "batch": args.batch,
                          "window": args.window, "bertology_words_per_s": round(words_per_step / ours_s),
                          "plain_words_per_s": round(words_per_step / plain_s),
                          "x_plain": round(plain_s / ours_s, 2)}), flush=True)


if __name__ == "__main__":
    main()
