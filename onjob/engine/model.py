"""The model the engine serves: base weights, tokenizer, and the LoRA adapters loaded on top.

Adapters are loaded with peft under their vLLM names. peft mixes adapters inside
one batch in eval mode (`adapter_names=[...]` per row, `__base__` for none), so
requests for different checkpoints share forward passes.

An adapter loaded is served until it is unloaded, but at most `max_resident` have their
weights in the model (`max_cpu_loras`, vLLM's name for its own cache of the same kind):
the least recently used idle one is taken out to make room, and loaded again from its
path when a request next names it (`use`), as vLLM's LRU reloads by path. A request is
never answered by other weights: an adapter that cannot be loaded again fails its request.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .errors import BadRequest, GenerationFailed, NotFound

BASE = "__base__"

log = logging.getLogger(__name__)


@dataclass
class Adapter:
    name: str
    path: str


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    path: str
    max_model_len: int
    eos_ids: frozenset[int]
    vocab_size: int  # the logits' width (may exceed the tokenizer's vocabulary)
    adapters: dict[str, Adapter] = field(default_factory=dict)  # served: loaded, not unloaded
    max_resident: int | None = None  # adapters with weights in the model at once (None: all)
    # Those with weights in the model, least recently used first.
    resident: OrderedDict[str, None] = field(default_factory=OrderedDict)
    reloads: int = 0  # adapters loaded again after they were taken out for room
    # Whether the LoRA layers are switched off (a batch of base-model rows runs without
    # them); None: not known (an adapter was just loaded or taken out).
    _layers_off: bool | None = field(default=None, init=False, repr=False)

    @classmethod
    def load(
        cls,
        path: Path,
        *,
        name: str,
        dtype: str = "float32",
        device: str = "cpu",
        max_model_len: int | None = None,
        max_resident: int | None = None,
    ) -> LoadedModel:
        torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        eos = set()
        for source in (model.config.eos_token_id, model.generation_config.eos_token_id):
            eos.update(
                source if isinstance(source, list) else [source] if source is not None else []
            )
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        limit = model.config.max_position_embeddings
        return cls(
            model=model,
            tokenizer=tokenizer,
            name=name,
            path=str(path),
            max_model_len=min(max_model_len or limit, limit),
            eos_ids=frozenset(eos),
            vocab_size=model.get_output_embeddings().weight.shape[0],
            max_resident=max_resident,
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def resolve(self, model: str) -> str | None:
        """Map a request's `model` to an adapter name (None for the base model), else 404."""
        if model in self.adapters:
            return model
        if model in (self.name, self.path):
            return None
        raise NotFound(f"The model `{model}` does not exist.", param="model")

    def forward(self, input_ids, attention_mask, position_ids, cache, adapters):
        """Logits for the last position of each row; `adapters[i]` is row i's adapter or None."""
        kwargs = dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        if not self.resident:
            return self.model(**kwargs)
        if all(a is None for a in adapters):
            self._switch(off=True)
            return self.model(**kwargs)
        self._switch(off=False)
        return self.model(**kwargs, adapter_names=[a or BASE for a in adapters])

    def _switch(self, *, off: bool) -> None:
        """The LoRA layers off for a base-model batch, on for one with adapters, switched
        only when that changes: peft's `disable_adapter()` around every step switched all
        of them twice per step, 35 ms of a 61 ms step of the bundled model with one
        adapter loaded (a user's answer took 1.8x its time while a candidate was loaded;
        bench/engine/priorities.py, docs/benchmarks.md). A user's steps in a row now switch
        nothing; a background step with adapters between them switches twice (13 ms)."""
        if self._layers_off is off:
            return
        lora = self.model.base_model
        if off:
            lora.disable_adapter_layers()
        else:
            lora.enable_adapter_layers()
        self._layers_off = off

    def load_adapter(self, name: str, path: str, busy: Collection[str] = ()) -> None:
        """Serve the adapter at `path` as `name`. `busy`: adapters generating now, which
        are not taken out to make room."""
        if name in self.adapters:
            raise BadRequest(
                f"The lora adapter '{name}' has already been loaded.", param="lora_name"
            )
        if name in (self.name, BASE):
            raise BadRequest(f"'{name}' is reserved for the base model.", param="lora_name")
        self._validate(Path(path))
        try:
            self._attach(name, path, busy)
        except Exception as exc:
            raise BadRequest(f"Loading the lora adapter '{name}' failed: {exc}") from exc
        self.adapters[name] = Adapter(name, path)

    def use(self, name: str, busy: Collection[str]) -> None:
        """Before a request of adapter `name` joins the batch: its weights in the model,
        loaded again from its path if they were taken out for room."""
        if name in self.resident:
            self.resident.move_to_end(name)
            return
        path = self.adapters[name].path
        try:
            self._attach(name, path, busy)
        except Exception as exc:
            raise GenerationFailed(
                f"The lora adapter '{name}' could not be loaded again from '{path}': {exc}"
            ) from exc
        self.reloads += 1
        log.info("adapter %s loaded again from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise NotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
        del self.adapters[name]
        if name in self.resident:
            self._detach(name)

    def _attach(self, name: str, path: str, busy: Collection[str]) -> None:
        from peft import PeftModel

        self._make_room(busy)
        try:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name, is_trainable=False)
            else:
                self.model = PeftModel.from_pretrained(
                    self.model, path, adapter_name=name, is_trainable=False
                )
        except Exception:
            if isinstance(self.model, PeftModel) and name in self.model.peft_config:
                self.model.delete_adapter(name)
            raise
        finally:
            self._layers_off = None  # new LoRA layers: switched as the next batch needs
        self.model.eval()
        self.resident[name] = None

    def _make_room(self, busy: Collection[str]) -> None:
        """Take out the least recently used idle adapters until one more fits. When every
        resident adapter is generating, none is: the model holds one more than its size
        until they finish (a row keeps its weights to its last token)."""
        while self.max_resident is not None and len(self.resident) >= self.max_resident:
            idle = next((n for n in self.resident if n not in busy), None)
            if idle is None:
                return
            self._detach(idle)

    def _detach(self, name: str) -> None:
        del self.resident[name]
        self._layers_off = None
        if self.resident:
            with warnings.catch_warnings():  # peft names the adapter it makes active: none is
                warnings.filterwarnings("ignore", "Adapter .* was active which is now deleted")
                self.model.delete_adapter(name)
        else:
            # With no adapter left, drop the LoRA layers entirely: plain forwards again.
            self.model = self.model.unload()

    def _validate(self, path: Path) -> None:
        """Check an adapter against the base model before touching the live model."""
        from safetensors import safe_open

        config_file = path / "adapter_config.json"
        if not config_file.is_file():
            raise BadRequest(f"No adapter found at '{path}' (adapter_config.json missing).")
        try:
            config = json.loads(config_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise BadRequest(f"Unreadable adapter_config.json in '{path}': {exc}") from exc
        if config.get("peft_type") != "LORA":
            raise BadRequest(
                f"'{path}' is not a LoRA adapter (peft_type={config.get('peft_type')})."
            )
        weights = path / "adapter_model.safetensors"
        if not weights.is_file():
            raise BadRequest(f"No adapter_model.safetensors in '{path}'.")
        modules = dict(self.model.named_modules())
        with safe_open(weights, "pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if ".lora_A." not in key:
                    continue
                module_name = key.split(".lora_A.")[0].removeprefix("base_model.model.")
                module = modules.get(module_name) or modules.get(f"base_model.model.{module_name}")
                in_features = getattr(getattr(module, "base_layer", module), "in_features", None)
                shape = f.get_slice(key).get_shape()
                if in_features is None or shape[1] != in_features:
                    raise BadRequest(
                        f"Adapter '{path}' does not fit the base model {self.name}: "
                        f"{module_name} (weight {key} has shape {shape})."
                    )
