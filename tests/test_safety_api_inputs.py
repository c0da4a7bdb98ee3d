"""No silent wrong answers from the inference API's inputs: texts in a collection without an order, arrays that are
not rectangular, an argument named by another's name. (Inputs audited and found right are listed in the commits.)"""

import numpy as np
import pytest
from conftest import ATOL, model_dir

import jaxbert


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("api_inputs")
    heads = {"BertModel": {}, "BertForSequenceClassification": {}, "BertForTokenClassification": {}}
    heads["BertForMaskedLM"] = {}
    heads["BertForQuestionAnswering"] = {"num_labels": 2}
    return {head: model_dir(root / head, head, max_position_embeddings=64, **kw) for head, kw in heads.items()}


def test_texts_without_an_order_are_refused_as_sentence_transformers_refuses_them(dirs):
    """A set (or a dict, whose keys are its texts) has no order for "vectors in input order" to follow: jaxbert
    embedded, classified and tagged them in whatever order they iterated; sentence-transformers' encode refuses both
    ('Unsupported input type: set'; a dict is one multimodal input there, keyed by modality). Lists, tuples and
    generators keep their order and are read as before."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(dirs["BertModel"], device="cpu")
    for given in ({"a text", "another text"}, {"a text": 0, "another text": 1}):
        with pytest.raises(ValueError, match="Unsupported input type: set|unrecognized modality keys"):
            st.encode(given)
    bert = jaxbert.load(dirs["BertModel"])
    cls, tagger = jaxbert.load(dirs["BertForSequenceClassification"]), jaxbert.load(dirs["BertForTokenClassification"])
    for kind, given in (("set", {"a text", "another text"}), ("dict", {"a text": 0, "another text": 1})):
        refused = f"texts is a {kind}, which has no order for the outputs to follow; give a list"
        with pytest.raises(TypeError, match=refused):
            bert.embed(given)
        with pytest.raises(TypeError, match=refused):
            bert.embed(given, packing=False)
        with pytest.raises(TypeError, match=refused):
            cls.classify(given)
        with pytest.raises(TypeError, match=refused):
            tagger.tag(given)
        with pytest.raises(TypeError, match=refused):
            tagger.tag({("a", "text"): 0} if kind == "dict" else {("a", "text")}, is_split_into_words=True)
        with pytest.raises(TypeError, match=refused.replace("texts", "pairs")):
            cls.classify(["a text", "another text"], pairs=given)
    texts = ["a text", "another text"]
    np.testing.assert_array_equal(bert.embed(iter(texts)), bert.embed(texts))
    np.testing.assert_array_equal(bert.embed(tuple(texts)), bert.embed(texts))


def test_arrays_that_are_not_rectangular_name_their_argument(dirs):
    """Rows of different lengths (a batch not padded) or a string where numbers go were numpy's message alone
    ('setting an array element with a sequence...', 'could not convert string to float'), naming no argument;
    torch.tensor refuses the same lists, so transformers takes none of them."""
    torch = pytest.importorskip("torch")
    bert = jaxbert.load(dirs["BertModel"])
    ragged = [[101, 2023, 102], [101, 102]]
    with pytest.raises(ValueError):
        torch.tensor(ragged)
    with pytest.raises(ValueError, match=r"^input_ids is not a rectangular array of numbers \(setting an array"):
        bert(ragged)
    with pytest.raises(ValueError, match=r"^attention_mask is not a rectangular array of numbers \("):
        bert([[101, 102], [101, 102]], [[1, 1], [1]])
    with pytest.raises(ValueError, match=r"^token_type_ids is not a rectangular array of numbers \("):
        bert([[101, 102], [101, 102]], None, [[0, 0], [0]])
    with pytest.raises(ValueError, match=r"^head_mask is not a rectangular array of numbers \(could not convert"):
        bert([[101, 102]], head_mask="all")
    out = bert([[101, 102]], head_mask=np.ones(4)).last_hidden_state
    np.testing.assert_allclose(out, bert([[101, 102]]).last_hidden_state, atol=ATOL)  # another program: round-off


def test_answer_names_max_seq_len_beyond_the_positions(dirs):
    """answer(max_seq_len=...) beyond the model's positions was refused as 'max_length 999: must be in [1, 64]',
    an argument answer does not have; the bound is named as the argument given."""
    qa = jaxbert.load(dirs["BertForQuestionAnswering"])
    with pytest.raises(ValueError, match=r"^max_seq_len 999: must be in \[1, 64\]$"):
        qa.answer("Who lives here?", "Anna lives here.", max_seq_len=999)
    assert qa.answer("Who lives here?", "Anna lives here.", max_seq_len=64) == qa.answer(
        "Who lives here?", "Anna lives here."
    )


def test_a_bad_item_is_named_by_its_own_parameter(dirs):
    """Errors of items were named by the tokenizer's words, not by the method's parameters: fill_mask(text=[...,
    None]) said texts[1]; tag's word lists words[i][j] (they are texts[i][j]); answer's question and context
    questions[0] / contexts[0] and 'example 0'; a prompt holding a lone surrogate was texts[0], a text's surrogate
    after a prompt at the prompted text's character."""
    mlm = jaxbert.load(dirs["BertForMaskedLM"])
    bad = "b [MASK] \udcff"
    with pytest.raises(TypeError, match=r"^text\[1\] is NoneType, not a string$"):
        mlm.fill_mask(["a [MASK]", None])
    with pytest.raises(ValueError, match=r"^text\[1\]: not valid Unicode \(a lone surrogate \\udcff at character 9"):
        mlm.fill_mask(["a [MASK]", bad])
    with pytest.raises(ValueError, match=r"^text 'b \[MASK\] \\udcff': not valid Unicode"):
        mlm.fill_mask(bad)
    with pytest.raises(ValueError, match=r"^text has 71 tokens, more than the model's 64$"):
        mlm.fill_mask("a [MASK]" + " word" * 67)
    with pytest.raises(ValueError, match=r"^text\[1\] has 71 tokens, more than the model's 64$"):
        mlm.fill_mask(["a [MASK]", "a [MASK]" + " word" * 67])
    bert = jaxbert.load(dirs["BertModel"])
    with pytest.raises(ValueError, match=r"^prompt 'query\\udcff: ': not valid Unicode"):
        bert.embed(["a", "b"], prompt="query\udcff: ")
    with pytest.raises(ValueError, match=r"^texts\[1\]: not valid Unicode \(a lone surrogate \\udcff at character 1;"):
        bert.embed(["a", "b\udcff"], prompt="query: ")
    tagger = jaxbert.load(dirs["BertForTokenClassification"])
    with pytest.raises(TypeError, match=r"^texts\[1\]\[1\] is NoneType, not a string$"):
        tagger.tag([["a"], ["b", None]], is_split_into_words=True)
    with pytest.raises(TypeError, match=r"^texts\[1\] is NoneType, not a string$"):
        tagger.tag(["a", None], is_split_into_words=True)  # one text's words
    with pytest.raises(ValueError, match=r"^texts\[1\]\[0\] '\\udcff': not valid Unicode"):
        tagger.tag([["a"], ["\udcff"]], is_split_into_words=True)
    qa = jaxbert.load(dirs["BertForQuestionAnswering"])
    with pytest.raises(ValueError, match=r"^question 'who\\udcff': not valid Unicode"):
        qa.answer("who\udcff", "me")
    with pytest.raises(ValueError, match=r"^context 'me\\udcff': not valid Unicode"):
        qa.answer("who", "me\udcff")
    with pytest.raises(ValueError, match=r"^question \(\d+ tokens with \[CLS\] and \[SEP\]\) leaves too little room"):
        qa.answer("who is it", "me " * 10, max_seq_len=6)


def test_generate_s_arrays_and_prompt_are_named_by_their_parameter(tmp_path):
    """Bert.generate's ids were named input_ids (its parameter is prompt_ids), a bert2bert's decoder_input_ids and
    decoder_attention_mask by the encoder's names, and a text prompt (jaxbert generate DIR PROMPT) texts[0]."""
    from conftest import bert2bert_dir

    from jaxbert.tasks import generate_text

    lm = jaxbert.load(model_dir(tmp_path / "lm", "BertLMHeadModel", is_decoder=True, num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"^prompt_ids is not a rectangular array of numbers"):
        lm.generate([[101, 2023], [101]])
    with pytest.raises(TypeError, match=r"^prompt_ids must be integers, got dtype <U5"):
        lm.generate("hello")
    with pytest.raises(ValueError, match=r"^attention_mask shape \(1, 1\) does not match prompt_ids shape \(1, 2\)"):
        lm.generate([[101, 2023]], attention_mask=[[1]])
    with pytest.raises(ValueError, match=r"^prompt 'x\\udcff': not valid Unicode"):
        generate_text(lm, "x\udcff")
    s2s = jaxbert.load(bert2bert_dir(tmp_path / "b2b"))
    with pytest.raises(ValueError, match=r"^decoder_input_ids is not a rectangular array of numbers"):
        s2s([[101, 2023]], decoder_input_ids=[[101, 2023], [101]])
    with pytest.raises(ValueError, match=r"^decoder_attention_mask shape \(1, 1\) does not match decoder_input_ids"):
        s2s([[101, 2023]], decoder_input_ids=[[101, 2023]], decoder_attention_mask=[[1]])
    with pytest.raises(ValueError, match=r"^input_ids is not a rectangular array of numbers"):  # its own name
        s2s.generate([[101, 2023], [101]])
