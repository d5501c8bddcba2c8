"""longctx.inject / longctx.uninject: swap modules of a PyTorch model for
longctx ones, chosen by rules (configs/inject/llama.yaml):

    - match: {name: "^model\\.layers\\.\\d+\\.self_attn$", class: LlamaAttention}
      replace: {class: longctx.torch.SparseAttention, kwargs: {config: demo.yaml}}

match.name is a regular expression searched in the module's qualified name
(as in model.named_modules()); match.class names the module's class or one of
its base classes (bare name or dotted path module.Class); give one or both.
replace.class is the dotted import path of the new module's class, called as
cls(original_module, **kwargs). A string kwargs.config is a path relative to
the rules file's directory, else to the working directory. The first
matching rule wins; the modules inside a replaced one are not visited.

Nothing here imports torch: the model is walked through its _modules.
"""
from __future__ import annotations

import importlib
import os
import re

__all__ = ["inject", "uninject", "load_rules", "DEFAULT_RULES"]

# Hugging Face decoder layouts (Llama, Mistral, Qwen2, ...): every layer's self_attn.
DEFAULT_RULES = [{"match": {"name": r"^model\.layers\.\d+\.self_attn$"},
                  "replace": {"class": "longctx.torch.SparseAttention"}}]

_STATE = "_longctx_injected"  # on the model: [(parent, attr, original, replacement, name)]


class _Rule:
    def __init__(self, where, name_re, cls_name, factory, kwargs):
        self.where, self.name_re, self.cls_name, self.factory, self.kwargs = where, name_re, cls_name, factory, kwargs

    def _name_ok(self, qualname):
        return self.name_re is None or self.name_re.search(qualname) is not None

    def _class_ok(self, module):
        if self.cls_name is None:
            return True
        mro = type(module).__mro__
        return self.cls_name in ({c.__name__ for c in mro} | {f"{c.__module__}.{c.__qualname__}" for c in mro})

    def matches(self, qualname, module):
        return self._name_ok(qualname) and self._class_ok(module)

    def near_miss(self, qualname, module):
        """Why a module this rule half matches (its name or its class, not both) is not
        replaced; None when it matches neither or both."""
        name_ok, class_ok = self._name_ok(qualname), self._class_ok(module)
        if name_ok == class_ok:
            return None
        if name_ok:
            return (f"{self.where}: '{qualname}' matches match.name but its class {type(module).__name__} "
                    f"is not '{self.cls_name}' (nor a base of it)")
        return (f"{self.where}: '{qualname}' ({type(module).__name__}) matches match.class but not "
                f"match.name '{self.name_re.pattern}'")


def _import_class(path, where):
    module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"{where}: key 'replace.class': expected a dotted path such as "
                         f"longctx.torch.SparseAttention, got '{path}'")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{where}: key 'replace.class': cannot import '{path}': {e}") from None
    if not callable(cls):
        raise ValueError(f"{where}: key 'replace.class': '{path}' is not a class")
    return cls


def _check_keys(d, allowed, where, prefix):
    if not isinstance(d, dict):
        raise ValueError(f"{where}: key '{prefix.rstrip('.') or 'rule'}': expected a mapping, got {d!r}")
    for key in d:
        if key not in allowed:
            raise ValueError(f"{where}: unknown key '{prefix}{key}' (expected one of: "
                             f"{', '.join(prefix + a for a in allowed)})")


def _resolve_config(value, base_dir, where):
    """A string config path: relative to the rules file's directory, else the working directory."""
    if not isinstance(value, (str, os.PathLike)):
        return value
    path = os.fspath(value)
    if os.path.isabs(path):
        return path
    for base in ([base_dir] if base_dir else []) + [os.getcwd()]:
        candidate = os.path.join(base, path)
        if os.path.exists(candidate):
            return os.path.abspath(candidate)
    dirs = f"{base_dir} or the working directory" if base_dir else "the working directory"
    raise ValueError(f"{where}: key 'replace.kwargs.config': no file '{path}' in {dirs}")


def _read_rules_file(path):
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{path}: reading a rules file needs PyYAML (Debian: python3-yaml)") from None
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"{path}: cannot read the rules file: {e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if isinstance(data, dict):  # a longctx config: the default rules with it
        return [dict(r, replace=dict(r["replace"], kwargs={"config": os.path.abspath(path)}))
                for r in DEFAULT_RULES]
    return data


def load_rules(rules, config=None):
    """Validated rules from a YAML path or a list of dicts. `config`, when given,
    replaces the config kwarg of every rule. ValueError names the rule and key."""
    base_dir, source = None, "<rules>"
    if isinstance(config, (str, os.PathLike)):
        if not os.path.exists(config):
            raise ValueError(f"inject: config '{os.fspath(config)}': no such file")
        config = os.path.abspath(config)
    if isinstance(rules, (str, os.PathLike)):
        source = os.fspath(rules)
        base_dir = os.path.dirname(os.path.abspath(source))
        rules = _read_rules_file(source)
    if not isinstance(rules, (list, tuple)) or not rules:
        raise ValueError(f"{source}: expected a non-empty list of rules (- match: ... replace: ...), got {rules!r}")
    out = []
    for i, rule in enumerate(rules):
        where = f"{source}: rule {i}"
        _check_keys(rule, ("match", "replace"), where, "")
        for key in ("match", "replace"):
            if key not in rule:
                raise ValueError(f"{where}: missing key '{key}'")
        match, replace = rule["match"], rule["replace"]
        _check_keys(match, ("name", "class"), where, "match.")
        _check_keys(replace, ("class", "kwargs"), where, "replace.")
        if "name" not in match and "class" not in match:
            raise ValueError(f"{where}: key 'match': give 'name' (a regular expression), 'class', or both")
        name_re = None
        if "name" in match:
            if not isinstance(match["name"], str):
                raise ValueError(f"{where}: key 'match.name': expected a regular expression string, "
                                 f"got {match['name']!r}")
            try:
                name_re = re.compile(match["name"])
            except re.error as e:
                raise ValueError(f"{where}: key 'match.name': bad regular expression '{match['name']}': {e}") from None
        cls_name = match.get("class")
        if cls_name is not None and (not isinstance(cls_name, str) or not cls_name):
            raise ValueError(f"{where}: key 'match.class': expected a class name, got {cls_name!r}")
        if "class" not in replace:
            raise ValueError(f"{where}: missing key 'replace.class'")
        if not isinstance(replace["class"], str):
            raise ValueError(f"{where}: key 'replace.class': expected a dotted path, got {replace['class']!r}")
        factory = _import_class(replace["class"], where)
        kwargs = replace.get("kwargs") or {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ValueError(f"{where}: key 'replace.kwargs': expected a mapping of argument names, got {kwargs!r}")
        kwargs = dict(kwargs)
        if config is not None:
            kwargs["config"] = config
        elif "config" in kwargs:
            kwargs["config"] = _resolve_config(kwargs["config"], base_dir, where)
        out.append(_Rule(where, name_re, cls_name, factory, kwargs))
    return out


def _walk(module, prefix, rules, found):
    """(parent, attr, child, qualified name, rule) of the first matches, not descending into them."""
    for attr, child in list(module._modules.items()):
        if child is None:
            continue
        name = prefix + attr
        rule = next((r for r in rules if r.matches(name, child)), None)
        if rule is not None:
            found.append((module, attr, child, name, rule))
        else:
            _walk(child, name + ".", rules, found)


def inject(model, rules=None, config=None):
    """Replaces the modules of `model` that the rules match (rules: a YAML path,
    a list of dicts, or None for DEFAULT_RULES; a YAML path holding a longctx
    config instead of rules means DEFAULT_RULES with that config). `config`
    (Config, path or dict), when given, is passed to every replacement instead
    of the rules' own. Returns the qualified names replaced. Replacements that
    share state (longctx.torch.SparseAttention: one KV store for the model)
    are bound together in walk order (their layer index). On error the model
    is left as it was."""
    if getattr(model, _STATE, None):
        raise ValueError("inject: the model is already injected; call longctx.uninject(model) first")
    if not hasattr(model, "_modules"):
        raise ValueError(f"inject: expected a torch.nn.Module, got {type(model).__name__}")
    compiled = load_rules(DEFAULT_RULES if rules is None else rules, config)
    found = []
    _walk(model, "", compiled, found)
    if not found:
        near = next((why for qualname, module in model.named_modules() if qualname
                     for why in (r.near_miss(qualname, module) for r in compiled) if why), None)
        raise ValueError("inject: no module of the model matched the rules (the names are those of "
                         "model.named_modules(), e.g. 'model.layers.0.self_attn')"
                         + (f"; nearest: {near}" if near else ""))
    done = []
    try:
        for parent, attr, child, name, rule in found:
            try:
                new = rule.factory(child, **rule.kwargs)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{rule.where}: cannot replace '{name}' ({type(child).__name__}): {e}") from e
            if hasattr(child, "training") and hasattr(new, "train"):
                new.train(child.training)
            setattr(parent, attr, new)
            done.append((parent, attr, child, new, name))
        groups = {}
        for record in done:
            bind = getattr(type(record[3]), "longctx_bind", None)
            if bind is not None:
                groups.setdefault(bind, []).append(record[3])
        for bind, modules in groups.items():
            bind(modules)
    except BaseException:
        for parent, attr, child, _, _ in reversed(done):
            setattr(parent, attr, child)
        raise
    model.__dict__[_STATE] = done
    return [record[4] for record in done]


def uninject(model):
    """Puts the original modules back (the same objects) and frees longctx's
    state (the KV store). Returns the names restored; [] if not injected."""
    done = model.__dict__.pop(_STATE, None) or []
    for parent, attr, child, new, _ in reversed(done):
        setattr(parent, attr, child)
        release = getattr(new, "longctx_release", None)
        if release is not None:
            release()
    return [record[4] for record in done]
