"""LangChain's OpenAI embeddings (langchain-openai, where it installs) against a real `bertology serve` app: the
vectors a LangChain pipeline gets are `bertology.embed`'s sentence vectors, L2-normalised, for documents and
queries alike. Its token-length check is off: that check downloads tiktoken's vocabulary, and this service
tokenizes with the model's own tokenizer."""

from __future__ import annotations

import numpy as np
import pytest
from live_server import running

from bertology import embed
from bertology.model import load
from bertology.serve import create_app

langchain_openai = pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "sk-langchain"
TEXTS = ["the cat sat on the mat .", "a dog ran in the park !", "good film", "the cat and the dog"]


def test_langchain_openai_embeddings_get_embeds_vectors(tiny_dir):
    pretrained = load(tiny_dir)
    expected = embed(pretrained, TEXTS, levels=("sentence",), normalize=True).sentences
    with running(create_app(tiny_dir, model_name="tiny", max_wait_ms=2, api_key=KEY)) as url:
        embeddings = langchain_openai.OpenAIEmbeddings(model="tiny", base_url=f"{url}/v1", api_key=KEY,
                                                       check_embedding_ctx_length=False, max_retries=0,
                                                       chunk_size=3)  # two requests: 3 texts, then 1
        documents = embeddings.embed_documents(TEXTS)
        query = embeddings.embed_query(TEXTS[1])
    # float32 vectors sent as JSON floats (or base64) and read back: exactly the service's float32 values
    np.testing.assert_allclose(np.asarray(documents), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.asarray(query), expected[1], atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(documents), axis=1), 1.0, atol=1e-5)
