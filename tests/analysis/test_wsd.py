"""WSD by the nearest sense vector: the framework scorer's conventions, the SemCor / framework / WordNet readers
and their errors, fitting and predicting with a tiny random model on a hand-made WordNet (every propagation step,
the fallbacks and their counts, standardisation, the gloss score), the command line, and a slice of the real data
with all-MiniLM-L6-v2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.analysis import wsd
from bertology.analysis.raganato import RaganatoError, read_keys, read_raganato, write_keys
from bertology.analysis.semcor import SemcorError, read_semcor
from bertology.analysis.wordnet import WordNet, WordNetError, load_wordnet
from bertology.cli.main import main
from bertology.embeddings import embed
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.tokenization import train_tokenizer

# ------------------------------------------------------------------------------------------- hand-made data

LEXNAMES = ("00\tadj.all\t3\n03\tnoun.Tops\t1\n04\tnoun.act\t1\n05\tnoun.animal\t1\n20\tnoun.plant\t1\n"
            "39\tverb.perception\t2\n")
DATA_NOUN = """  1 This software and database is being provided to you, the LICENSEE, by Princeton University
00000001 03 n 01 entity 0 000 | that which exists
00000002 05 n 02 dog 0 domestic_dog 0 001 @ 00000001 n 0000 | a domesticated canid; "the dog barked"
00000003 05 n 01 cat 0 001 @ 00000001 n 0000 | a small feline
00000004 05 n 01 puppy 0 001 @ 00000002 n 0000 | a young dog
00000005 04 n 01 bark 0 000 | the sound a dog makes
00000006 05 n 01 bark 1 000 | tough outer covering of a tree
00000007 20 n 01 tree 0 000 | a tall plant
"""
DATA_VERB = "00000001 39 v 01 bark 0 000 01 + 02 00 | make barking sounds; \"the dogs barked\"\n"
DATA_ADJ = "00000001 00 s 02 handy 0 ready_to_hand(p) 0 000 | easy to reach\n"
INDEX_SENSE = """bark%1:04:00:: 00000005 1 3
bark%1:05:00:: 00000006 2 0
bark%2:39:00:: 00000001 1 2
cat%1:05:00:: 00000003 1 5
dog%1:05:00:: 00000002 1 10
domestic_dog%1:05:00:: 00000002 1 0
entity%1:03:00:: 00000001 1 0
handy%5:00:00:accessible:00 00000001 1 0
puppy%1:05:00:: 00000004 1 0
ready_to_hand%5:00:00:accessible:00 00000001 1 0
tree%1:20:00:: 00000007 1 0
"""
TAGFILE = """<contextfile concordance=brown>
<context filename=br-x01 paras=yes>
<p pnum=1>
<s snum=1>
<wf cmd=ignore pos=DT>The</wf>
<wf cmd=done pos=NN lemma=dog wnsn=1 lexsn=1:05:00::>dog</wf>
<wf cmd=done pos=VB lemma=bark wnsn=1 lexsn=2:39:00::>barked</wf>
<punc>.</punc>
</s>
<s snum=2>
<wf cmd=done pos=NN lemma=cat wnsn=1;0 lexsn=1:05:00::;1:05:01::>cat</wf>
<wf cmd=done pos=NN lemma=dog wnsn=1;1 lexsn=1:05:00::;1:05:00::>dog</wf>
<wf cmd=done pos=NN lemma=bark wnsn=1 lexsn=1:04:00::>bark</wf>
<wf cmd=done pos=JJ lemma=handy wnsn=1 lexsn=5:00:00:accessible(a):00>handy</wf>
<wf cmd=done pos=NN lemma=gadget wnsn=1 lexsn=1:06:00::>thing</wf>
<wf cmd=done rdf=person pos=NNP lemma=person wnsn=1 lexsn=1:03:00:: pn=person>John_Smith</wf>
<wf cmd=done pos=RB ot=notag>there</wf>
</s>
</p>
</context>
</contextfile>
"""
DATA_XML = """<?xml version="1.0" encoding="UTF-8" ?>
<corpus lang="en" source="tiny">
<text id="d000">
<sentence id="d000.s000">
<wf lemma="the" pos="DET">The</wf>
<instance id="d000.s000.t000" lemma="dog" pos="NOUN">dog</instance>
<instance id="d000.s000.t001" lemma="bark" pos="VERB">barked</instance>
<wf lemma="." pos=".">.</wf>
</sentence>
<sentence id="d000.s001">
<instance id="d000.s001.t000" lemma="bark" pos="NOUN">bark</instance>
<instance id="d000.s001.t001" lemma="entity" pos="NOUN">entity</instance>
<instance id="d000.s001.t002" lemma="zebra" pos="NOUN">zebra</instance>
<instance id="d000.s001.t003" lemma="puppy" pos="NOUN">puppy</instance>
<instance id="d000.s001.t004" lemma="tree" pos="NOUN">tree</instance>
<instance id="d000.s001.t005" lemma="domestic_dog" pos="NOUN">dog</instance>
</sentence>
</text>
</corpus>
"""
GOLD = """d000.s000.t000 dog%1:05:00::
d000.s000.t001 bark%2:39:00::
d000.s001.t000 bark%1:05:00:: bark%1:04:00::
d000.s001.t001 entity%1:03:00::
d000.s001.t002 zebra%1:05:00::
d000.s001.t003 puppy%1:05:00::
d000.s001.t004 tree%1:20:00::
d000.s001.t005 domestic_dog%1:05:00::
"""
WORDS = "The dog barked . cat bark handy thing John Smith there entity zebra puppy tree".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A hand-made WordNet, SemCor file, framework data set and a 4-layer random BERT over their words."""
    root = tmp_path_factory.mktemp("wsd")
    wordnet = root / "wordnet"
    wordnet.mkdir()
    for name, text in (("lexnames", LEXNAMES), ("data.noun", DATA_NOUN), ("data.verb", DATA_VERB),
                       ("data.adj", DATA_ADJ), ("data.adv", ""), ("index.sense", INDEX_SENSE)):
        (wordnet / name).write_text(text, encoding="utf-8")
    tagfiles = root / "semcor" / "brown1" / "tagfiles"
    tagfiles.mkdir(parents=True)
    (tagfiles / "br-x01").write_text(TAGFILE, encoding="utf-8")
    (root / "tiny.data.xml").write_text(DATA_XML, encoding="utf-8")
    (root / "tiny.gold.key.txt").write_text(GOLD, encoding="utf-8")
    tokenizer = train_tokenizer(iter(WORDS * 3), "wordpiece", 60, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=4, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(root / "model")
    return root


@pytest.fixture(scope="module")
def fitted(tiny):
    pretrained = load(tiny / "model")
    senses = wsd.fit_senses(pretrained, tiny / "semcor", tiny / "wordnet", layers="sum-last-four",
                            propagate="lexname", gloss_weight=0.0, standardize=False, first_sense_bonus=0.0)
    return pretrained, senses


def span(result, text: int, word: str, occurrence: int = 0) -> np.ndarray:
    return result.vector(text, word, occurrence).astype(np.float64)


# ----------------------------------------------------------------------------------------------------- scorer


def test_scorer_follows_the_framework_conventions(tmp_path):
    gold = {"a": ["k1", "k2"], "b": ["k3"], "c": ["k4%2:30:00::"], "d": ["k5%1:01:00::"]}
    # a: right (any gold key counts); b: wrong; c: two answers, one right -> 1/2; d: unanswered; z: not in gold.
    system = {"a": ["k2"], "b": ["k1"], "c": ["k4%2:30:00::", "x"], "z": ["k1"]}
    result = wsd.score(gold, system)
    assert result["right"] == 1.5 and result["answered"] == 3 and result["total"] == 4
    assert result["P"] == pytest.approx(50.0) and result["R"] == pytest.approx(37.5)
    assert result["F1"] == pytest.approx(2 * 50 * 37.5 / 87.5)
    assert result["unknown ids in predictions"] == 1
    assert result["per_pos"]["VERB"]["P"] == pytest.approx(50.0)
    assert result["per_pos"]["NOUN"] == {"P": 0.0, "R": 0.0, "F1": 0.0, "right": 0, "answered": 0, "total": 1}
    # Files give the same result as mappings; a repeated id adds its keys as the Java scorer's sets do.
    (tmp_path / "gold.key").write_text("a k1\na k2\nb k3\nc k4%2:30:00::\nd k5%1:01:00::\n")
    (tmp_path / "pred.key").write_text("a k2\nb k1\nc k4%2:30:00:: x\nz k1\n\n")
    assert wsd.score(tmp_path / "gold.key", tmp_path / "pred.key") == result
    assert wsd.score(gold, {})["P"] == 0.0  # nothing answered: P is 0, not a division by zero


def test_key_file_errors_name_file_and_line(tmp_path):
    path = tmp_path / "bad.key"
    path.write_text("d0.t0 art%1:09:00::\nd0.t1\n")
    with pytest.raises(RaganatoError, match=r"bad.key, line 2: expected 'id key"):
        read_keys(path)
    written = write_keys(tmp_path / "out" / "p.key", {"i1": "k1", "i2": ["k2", "k3"]})
    assert written.read_text() == "i1 k1\ni2 k2 k3\n"
    assert read_keys(written) == {"i1": ["k1"], "i2": ["k2", "k3"]}


# ---------------------------------------------------------------------------------------------------- readers


def test_semcor_reader_handles_multiword_several_keys_and_wnsn0(tiny):
    corpus = read_semcor(tiny / "semcor")
    first, second = corpus.sentences
    assert first.text == "The dog barked ." and first.line == 4
    assert [t.keys for t in first.tokens] == [(), ("dog%1:05:00::",), ("bark%2:39:00::",), ()]
    mwe = second.tokens[5]
    assert mwe.text == "John Smith" and second.text[mwe.start:mwe.end] == "John Smith"
    assert mwe.keys == ("person%1:03:00::",)
    assert second.tokens[0].keys == ("cat%1:05:00::",)  # wnsn=0 key skipped
    assert second.tokens[1].keys == ("dog%1:05:00::",)  # a key given twice counts once
    assert second.tokens[3].keys == ("handy%5:00:00:accessible:00",)  # SemCor's "(a)" marker removed
    assert corpus.counts["keys skipped (wnsn=0)"] == 1
    assert corpus.counts["keys with a head-word marker removed"] == 1
    assert corpus.counts["tagged tokens"] == 8 and corpus.counts["tokens"] == 11


@pytest.mark.parametrize("line, message", [
    ("<wf cmd=done pos=NN lemma=dog wnsn=1;2 lexsn=1:05:00::>dog</wf>", "wnsn= and lexsn= lists of equal length"),
    ("<wf cmd=done pos=NN lemma=dog>dog", "not a SemCor tag line"),
    ("<s snum=9>", "<s> inside the sentence opened at line 4"),
])
def test_semcor_errors_name_file_and_line(tmp_path, line, message):
    tagfiles = tmp_path / "tagfiles"
    tagfiles.mkdir()
    lines = TAGFILE.splitlines()
    lines.insert(5, line)
    (tagfiles / "br-z01").write_text("\n".join(lines) + "\n")
    with pytest.raises(SemcorError, match=rf"br-z01, line 6: .*{message}" if "inside" not in message
                       else rf"br-z01, line 6: {message}"):
        read_semcor(tagfiles)


def test_semcor_unclosed_sentence_and_empty_directory(tmp_path):
    tagfiles = tmp_path / "tagfiles"
    tagfiles.mkdir()
    (tagfiles / "br-z02").write_text("<s snum=1>\n<punc>.</punc>\n")
    with pytest.raises(SemcorError, match=r"br-z02, line 1: <s> is never closed"):
        read_semcor(tagfiles)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SemcorError, match="empty: no SemCor tag files"):
        read_semcor(tmp_path / "empty")


def test_raganato_reader_spans_and_errors(tiny, tmp_path):
    data = read_raganato(tiny / "tiny.data.xml")
    assert [s.text for s in data.sentences] == ["The dog barked .", "bark entity zebra puppy tree dog"]
    barked = data.instances[1]
    assert (barked.id, barked.lemma, barked.pos, barked.line) == ("d000.s000.t001", "bark", "VERB", 7)
    assert data.sentences[barked.sentence].text[barked.start:barked.end] == "barked"
    bad = tmp_path / "bad.data.xml"
    bad.write_text(DATA_XML.replace('<wf lemma="." pos=".">.</wf>', '<wf lemma="." pos=".">.</w>'))
    with pytest.raises(RaganatoError, match=r"bad.data.xml, line 8: malformed XML \(mismatched tag\)"):
        read_raganato(bad)
    bad.write_text(DATA_XML.replace('lemma="entity" ', ""))
    with pytest.raises(RaganatoError, match=r"bad.data.xml, line 12: <instance> without lemma"):
        read_raganato(bad)


def test_wordnet_reader_on_hand_made_files(tiny, tmp_path):
    wordnet = WordNet(tiny / "wordnet")
    assert wordnet.candidates("Bark", "NOUN") == ["bark%1:04:00::", "bark%1:05:00::"]
    assert wordnet.candidates("bark", "v") == ["bark%2:39:00::"] and wordnet.candidates("zebra", "NOUN") == []
    assert wordnet.first_sense("handy", "ADJ") == "handy%5:00:00:accessible:00"
    dog = wordnet.synset_of("domestic_dog%1:05:00::")
    assert dog.lemmas == ("dog", "domestic_dog") and dog.hypernyms == ("n:00000001",)
    assert dog.definition == "a domesticated canid" and dog.lexname == "noun.animal"
    assert wordnet.synset_of("ready_to_hand%5:00:00:accessible:00").lemmas == ("handy", "ready_to_hand")
    assert wordnet.gloss_text("domestic_dog%1:05:00::") == "domestic dog - dog , domestic dog - a domesticated canid"
    broken = tmp_path / "wn"
    broken.mkdir()
    for name in ("lexnames", "data.noun", "data.verb", "data.adj", "data.adv"):
        (broken / name).write_text((tiny / "wordnet" / name).read_text())
    (broken / "index.sense").write_text(INDEX_SENSE + "bark%1:09:00:: 00000099 3 0\n")
    with pytest.raises(WordNetError, match=r"index.sense, line 12: bark%1:09:00:: points to synset offset "
                                           r"00000099, which is not in data.noun"):
        WordNet(broken)
    (broken / "index.sense").write_text("dog%1:05:00:: 00000002\n")
    with pytest.raises(WordNetError, match=r"index.sense, line 1: expected 'sense_key"):
        WordNet(broken)


def test_real_wordnet_counts_and_order(data_dir):
    wordnet = load_wordnet(data_dir / "wordnet-3.0")
    assert len(wordnet.synsets) == 117659 and len(wordnet.senses) == 206941
    bank = wordnet.candidates("bank", "NOUN")
    assert bank[:2] == ["bank%1:17:01::", "bank%1:14:00::"] and len(bank) == 10
    assert wordnet.first_sense("peculiar", "ADJ") == "peculiar%5:00:00:strange:00"
    assert wordnet.synset_of("atlanta%1:15:00::").instance_hypernyms == ("n:08695539",)


# ------------------------------------------------------------------------------------------------ fit, predict


def test_fit_averages_the_tagged_tokens_and_counts_what_it_skips(tiny, fitted):
    pretrained, senses = fitted
    texts = [s.text for s in read_semcor(tiny / "semcor").sentences]
    result = embed(pretrained, texts, layers="sum-last-four", levels=("token",))
    dog = (span(result, 0, "dog") + span(result, 1, "dog")) / 2  # a token tagged twice with one key counts once
    np.testing.assert_allclose(senses.vectors[senses.index["dog%1:05:00::"]], dog, atol=1e-5)
    assert senses.counts[senses.index["dog%1:05:00::"]] == 2
    np.testing.assert_allclose(senses.vectors[senses.index["handy%5:00:00:accessible:00"]], span(result, 1, "handy"),
                               atol=1e-5)
    assert sorted(senses.keys) == ["bark%1:04:00::", "bark%2:39:00::", "cat%1:05:00::", "dog%1:05:00::",
                                   "handy%5:00:00:accessible:00"]
    assert senses.stats["keys not in WordNet"] == 2 and senses.stats["keys skipped (wnsn=0)"] == 1
    # mu and sigma: every SemCor token (the multi-word expression as one token), sigma with n - 1.
    every = np.stack([result.span(i, t.start, t.end).astype(np.float64)
                      for i, s in enumerate(read_semcor(tiny / "semcor").sentences) for t in s.tokens])
    np.testing.assert_allclose(senses.mean, every.mean(0), atol=1e-4)
    np.testing.assert_allclose(senses.std, every.std(0, ddof=1), rtol=1e-4, atol=1e-5)
    # Lexname vectors: each synset with a vector after the synset and hypernym steps, once (LMMS extend.py).
    v = {k: senses.vectors[senses.index[k]].astype(np.float64) for k in senses.keys}
    animal = senses.lexname_vectors[senses.lexnames.index("noun.animal")]
    np.testing.assert_allclose(animal, (v["dog%1:05:00::"] * 2 + v["cat%1:05:00::"]) / 3, atol=1e-5)
    assert "noun.plant" not in senses.lexnames and "noun.Tops" not in senses.lexnames


def test_save_and_load_round_trip(fitted, tmp_path):
    _, senses = fitted
    path = senses.save(tmp_path / "s" / "senses.npz")
    again = wsd.SenseVectors.load(path)
    assert again.keys == senses.keys and again.config == senses.config and again.model == senses.model
    np.testing.assert_array_equal(again.vectors, senses.vectors)
    np.testing.assert_array_equal(again.lexname_vectors, senses.lexname_vectors)
    assert [p.name for p in path.parent.iterdir()] == ["senses.npz"]
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(wsd.SenseVectorError, match="junk.npz: not a sense-vector file"):
        wsd.SenseVectors.load(tmp_path / "junk.npz")


def test_propagation_levels_and_fallback_counts(tiny, fitted):
    pretrained, senses = fitted
    data, wordnet = tiny / "tiny.data.xml", tiny / "wordnet"
    sources = {}
    answers = {}
    for level in wsd.PROPAGATIONS:
        answers[level], summary = wsd.predict(pretrained, senses, wordnet, data, propagate=level)
        sources[level] = summary["candidate vectors by source"]
        counts = summary["counts"]
        assert counts["instances"] == 8 and counts["lemmas with no senses (unanswered)"] == 1
        assert "d000.s001.t002" not in answers[level]  # zebra: no senses, no answer
    # entity: no vector at any level (no tagged synset, no hypernym, an empty lexname) -> first sense
    assert answers["lexname"]["d000.s001.t001"] == "entity%1:03:00::"
    none = wsd.predict(pretrained, senses, wordnet, data, propagate="none")[1]["counts"]
    # without propagation: entity, puppy, tree and domestic_dog have no candidate vector
    assert none["first-sense fallback (no candidate has a vector)"] == 4
    assert answers["synset"]["d000.s001.t005"] == "domestic_dog%1:05:00::"
    full = wsd.predict(pretrained, senses, wordnet, data, propagate="lexname")[1]["counts"]
    assert full["first-sense fallback (no candidate has a vector)"] == 2  # entity, tree (noun.plant is empty)
    assert sources["none"] == {"semcor": 3, "none": 5}
    assert sources["synset"] == {"semcor": 3, "synset": 1, "none": 4}  # domestic_dog from dog
    assert sources["hypernym"] == {"semcor": 3, "synset": 1, "hypernym": 1, "none": 3}  # puppy from dog's synset
    assert sources["lexname"] == {"semcor": 3, "synset": 1, "hypernym": 1, "lexname": 1, "none": 2}  # bark%1:05


def test_nearest_sense_by_hand(tiny, fitted):
    """bark NOUN: argmax of the cosine to bark%1:04:00:: (SemCor) and bark%1:05:00:: (noun.animal's mean), plain
    and standardised, and the gloss-weighted score."""
    pretrained, senses = fitted
    data, wordnet = tiny / "tiny.data.xml", tiny / "wordnet"
    result = embed(pretrained, ["bark entity zebra puppy tree dog"], layers="sum-last-four", levels=("token",))
    t = span(result, 0, "bark")
    seen = senses.vectors[senses.index["bark%1:04:00::"]].astype(np.float64)
    animal = senses.lexname_vectors[senses.lexnames.index("noun.animal")].astype(np.float64)
    gloss = embed(pretrained, [WordNet(wordnet).gloss_text(k) for k in ("bark%1:04:00::", "bark%1:05:00::")],
                  layers="sum-last-four", levels=("sentence",)).sentences.astype(np.float64)

    def cos(a, b):
        return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

    for standardize in (False, True):
        z = (lambda x: (x - senses.mean) / senses.std) if standardize else (lambda x: x)
        for w in (0.0, 0.5, 1.0):
            s = [(1 - w) * cos(z(t), z(v)) + w * cos(z(t), z(g)) for v, g in zip((seen, animal), gloss)]
            expected = ("bark%1:04:00::", "bark%1:05:00::")[int(np.argmax(s))]
            got = wsd.predict(pretrained, senses, wordnet, data, propagate="lexname", gloss_weight=w,
                              standardize=standardize)[0]["d000.s001.t000"]
            assert got == expected, (standardize, w, s)
    # A (mu, sigma) pair from elsewhere is used as given: the SemCor estimate passed explicitly changes nothing.
    explicit = wsd.predict(pretrained, senses, wordnet, data, standardize=(senses.mean, senses.std))
    assert explicit[0] == wsd.predict(pretrained, senses, wordnet, data, standardize=True)[0]
    assert explicit[1]["options"]["standardize"] == "given"
    with pytest.raises(wsd.ConfigError, match=r"standardize: expected \(mu, sigma\) of shape \[32\]"):
        wsd.predict(pretrained, senses, wordnet, data, standardize=(senses.mean[:3], senses.std[:3]))
    # The first sense's bonus: the other sense wins only when nearer by more than the bonus.
    margin = cos(t, animal) - cos(t, seen)
    for bonus in (0.0, max(margin, 0) + 1e-3):
        got = wsd.predict(pretrained, senses, wordnet, data, propagate="lexname", gloss_weight=0.0,
                          first_sense_bonus=bonus)[0]["d000.s001.t000"]
        assert got == ("bark%1:05:00::" if margin > bonus else "bark%1:04:00::")


def test_predict_refuses_vectors_of_another_model(tiny, fitted, tmp_path):
    _, senses = fitted
    other = load(tiny / "model")
    with torch.no_grad():
        next(other.model.parameters()).add_(0.01)
    with pytest.raises(wsd.SenseVectorError, match="were fitted with the model"):
        wsd.predict(other, senses, tiny / "wordnet", tiny / "tiny.data.xml")


def test_cli_fit_predict_score_round_trip(tiny, tmp_path, capsys):
    out, pred = tmp_path / "senses.npz", tmp_path / "pred.key"
    assert main(["wsd", "fit", "--model", str(tiny / "model"), "--semcor", str(tiny / "semcor"), "--wordnet",
                 str(tiny / "wordnet"), "--out", str(out), "--layers=-2,-1", "--combine", "sum",
                 "--gloss-weight", "0.25", "--no-standardize", "--quiet"]) == 0
    fit_report = json.loads(capsys.readouterr().out)
    assert fit_report["config"]["layers"] == [-2, -1] and fit_report["config"]["gloss_weight"] == 0.25
    assert main(["wsd", "predict", "--model", str(tiny / "model"), "--senses", str(out), "--wordnet",
                 str(tiny / "wordnet"), "--data", str(tiny / "tiny.data.xml"), "--output", str(pred),
                 "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["options"]["gloss_weight"] == 0.25 and summary["counts"]["instances"] == 8
    lines = pred.read_text().splitlines()
    assert len(lines) == 7 and lines[0] == "d000.s000.t000 dog%1:05:00::"
    assert main(["wsd", "score", "--gold", str(tiny / "tiny.gold.key.txt"), "--predictions", str(pred)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["answered"] == 7 and scores["total"] == 8 and scores["per_pos"]["VERB"]["P"] == 100.0
    assert scores == wsd.score(tiny / "tiny.gold.key.txt", pred)
    (tmp_path / "bad.key").write_text("d000.s000.t000\n")
    assert main(["wsd", "score", "--gold", str(tiny / "tiny.gold.key.txt"), "--predictions",
                 str(tmp_path / "bad.key")]) == 2
    assert "bad.key, line 1" in capsys.readouterr().err


def test_cli_device_cpu_is_bit_identical_to_the_default(tiny, tmp_path, capsys, monkeypatch):
    """`wsd fit` and `wsd predict` with --device cpu write the same bytes as with the default (auto: the CPU here);
    --device cuda without a GPU is a one-line error naming --device."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    written = []
    for extra in ([], ["--device", "cpu", "--dtype", "float32"]):
        out, pred = tmp_path / f"senses{len(written)}.npz", tmp_path / f"pred{len(written)}.key"
        assert main(["wsd", "fit", "--model", str(tiny / "model"), "--semcor", str(tiny / "semcor"), "--wordnet",
                     str(tiny / "wordnet"), "--out", str(out), "--quiet", *extra]) == 0
        assert main(["wsd", "predict", "--model", str(tiny / "model"), "--senses", str(out), "--wordnet",
                     str(tiny / "wordnet"), "--data", str(tiny / "tiny.data.xml"), "--output", str(pred), "--quiet",
                     *extra]) == 0
        senses = wsd.SenseVectors.load(out)
        written.append((senses.keys, senses.vectors.tobytes(), senses.mean.tobytes(), pred.read_bytes()))
    capsys.readouterr()
    assert written[0] == written[1]
    assert main(["wsd", "predict", "--model", str(tiny / "model"), "--senses", str(out), "--wordnet",
                 str(tiny / "wordnet"), "--data", str(tiny / "tiny.data.xml"), "--output", str(tmp_path / "x.key"),
                 "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertology wsd: error: --device: 'cuda' asked for") and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------- real data


def test_minilm_on_a_semcor_slice(minilm_path, data_dir, tmp_path):
    """200 SemCor sentences: without propagation most semeval2007 instances fall back to the first sense, and the
    counts add up; with propagation every instance with senses is answered by a vector."""
    torch.set_num_threads(1)
    pretrained = load(minilm_path)
    senses = wsd.fit_senses(pretrained, data_dir / "semcor3.0-subset", data_dir / "wordnet-3.0", max_sentences=200,
                            gloss_weight=0.0)
    assert senses.stats["sentences"] == 200 and "keys not in WordNet" not in senses.stats
    data = data_dir / "wsd-raganato2017" / "semeval2007" / "semeval2007.data.xml"
    gold = data.with_name("semeval2007.gold.key.txt")
    answers, summary = wsd.predict(pretrained, senses, data_dir / "wordnet-3.0", data, tmp_path / "p.key",
                                   propagate="none")
    counts = summary["counts"]
    assert counts["instances"] == 455
    assert counts["answered by nearest sense"] + counts["first-sense fallback (no candidate has a vector)"] == 455
    assert counts["first-sense fallback (no candidate has a vector)"] > 100
    scores = wsd.score(gold, tmp_path / "p.key")
    assert scores["total"] == 455 and scores["answered"] == 455 and 30 < scores["F1"] < 80
    full = wsd.predict(pretrained, senses, data_dir / "wordnet-3.0", data, propagate="lexname")[1]["counts"]
    assert full["answered by nearest sense"] == 455


def test_report_section_writes_numbers_and_the_command(tiny, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "semcor3.0-subset").symlink_to(tiny / "semcor")
    (data / "wordnet-3.0").symlink_to(tiny / "wordnet")
    for name in ("senseval2", "semeval2007"):
        folder = data / "wsd-raganato2017" / name
        folder.mkdir(parents=True)
        (folder / f"{name}.data.xml").write_text(DATA_XML)
        (folder / f"{name}.gold.key.txt").write_text(GOLD)
    out = tmp_path / "my out $(touch pwned) 'x'"  # the redo command must keep it one word and run nothing
    section = wsd.report_section(str(tiny / "model"), out, data)
    numbers = json.loads((out / "wsd.json").read_text())
    assert section.name == "wsd" and section.numbers == numbers
    for name in ("senseval2", "semeval2007"):
        scored = numbers["sets"][name]
        assert scored["first sense"]["total"] == 8 and scored["nearest sense"]["total"] == 8
        assert scored["prediction"]["counts"]["instances"] == 8
        assert (out / f"wsd-{name}.key").is_file()
    assert section.command.startswith(f"bertology wsd fit --model {tiny / 'model'} --semcor ")
    assert wsd.SenseVectors.load(out / "wsd-senses.npz").config == numbers["config"]
    # Run the command in bash with `bertology` as a function that logs its arguments, one a line.
    import subprocess

    log = tmp_path / "args.log"
    done = subprocess.run(["bash", "-c", f"bertology() {{ printf '%s\\n' \"$@\" >> '{log}'; }}; " + section.command],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    words = log.read_text().splitlines()
    assert str(out / "wsd-senses.npz") in words and str(out / "wsd-semeval2007.key") in words
    assert str(data / "wsd-raganato2017" / "senseval2" / "senseval2.data.xml") in words
    assert not (tmp_path / "pwned").exists()


def test_fit_refuses_a_corpus_with_no_wordnet_key(tiny, tmp_path):
    tagfiles = tmp_path / "tagfiles"
    tagfiles.mkdir()
    (tagfiles / "br-z03").write_text("<s snum=1>\n<wf cmd=done pos=NN lemma=gadget wnsn=1 lexsn=1:06:00::>thing</wf>\n"
                                     "</s>\n")
    with pytest.raises(wsd.DataError, match="tagfiles: no token is tagged with a WordNet sense key"):
        wsd.fit_senses(str(tiny / "model"), tagfiles, tiny / "wordnet", layers="last")


# ------------------------------------------------------------------------------------------------- bad bytes


@pytest.mark.parametrize("cut", [0, 1, 30, 200, -1, -30, -200])
def test_truncated_or_empty_sense_files_are_named(fitted, tmp_path, cut):
    _, senses = fitted
    whole = senses.save(tmp_path / "senses.npz").read_bytes()
    bad = tmp_path / "bad.npz"
    bad.write_bytes(whole[:cut])
    with pytest.raises(wsd.SenseVectorError, match=r"bad.npz: (the file is empty|not a sense-vector file|member)"):
        wsd.SenseVectors.load(bad)


def test_a_sense_file_whose_array_header_claims_more_is_refused_before_reading(fitted, tmp_path):
    import io
    import zipfile

    _, senses = fitted
    path = senses.save(tmp_path / "senses.npz")
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    vectors = np.load(io.BytesIO(members["vectors.npy"]))
    members["vectors.npy"] = members["vectors.npy"].replace(str(vectors.shape).encode(),
                                                            f"({10 ** 9}, {vectors.shape[1]})".encode(), 1)
    with zipfile.ZipFile(tmp_path / "big.npz", "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with pytest.raises(wsd.SenseVectorError, match=r"big.npz: member vectors.npy: its header says shape "
                                                   r"\[1000000000, 32\]"):
        wsd.SenseVectors.load(tmp_path / "big.npz")


def test_cli_wsd_predict_names_a_truncated_sense_file_and_an_output_directory(tiny, fitted, tmp_path, capsys):
    _, senses = fitted
    (tmp_path / "cut.npz").write_bytes(senses.save(tmp_path / "s.npz").read_bytes()[:100])
    common = ["wsd", "predict", "--model", str(tiny / "model"), "--wordnet", str(tiny / "wordnet"), "--data",
              str(tiny / "tiny.data.xml"), "--quiet"]
    assert main([*common, "--senses", str(tmp_path / "cut.npz"), "--output", str(tmp_path / "p.key")]) == 2
    err = capsys.readouterr().err
    assert "cut.npz: not a sense-vector file" in err and err.count("\n") == 1
    # An existing directory as --output: refused before the sense file is even read (here: one that is missing).
    assert main([*common, "--senses", str(tmp_path / "missing.npz"), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--output {tmp_path}: is a directory" in err and err.count("\n") == 1


def test_a_key_file_in_latin1_names_the_line_and_byte(tiny, tmp_path, capsys):
    path = tmp_path / "latin1.key"
    path.write_bytes("d000.s000.t000 dog%1:05:00::\nd000.s000.t001 caf\xe9%1:13:00::\n".encode("latin-1"))
    with pytest.raises(RaganatoError, match=r"latin1.key, line 2: cannot decode as utf-8 at byte offset 47 "
                                            r"\(byte 0xe9\)"):
        read_keys(path)
    assert main(["wsd", "score", "--gold", str(tiny / "tiny.gold.key.txt"), "--predictions", str(path)]) == 2
    err = capsys.readouterr().err
    assert "latin1.key, line 2" in err and err.count("\n") == 1


def test_wsd_fit_refuses_a_directory_as_out_before_fitting(tmp_path, capsys):
    (tmp_path / "d.npz").mkdir()
    assert main(["wsd", "fit", "--model", str(tmp_path / "no-model"), "--semcor", str(tmp_path), "--wordnet",
                 str(tmp_path), "--out", str(tmp_path / "d.npz")]) == 2
    err = capsys.readouterr().err
    assert f"--out {tmp_path / 'd.npz'}: is a directory" in err and err.count("\n") == 1
