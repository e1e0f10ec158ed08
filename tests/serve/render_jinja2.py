#!/usr/bin/env python3
"""Renders the cases of chat_template_reference.json with Python's jinja2 the
way transformers' apply_chat_template does (sandboxed environment,
trim_blocks, lstrip_blocks, loop controls, its tojson / raise_exception /
strftime_now) and adds jinja2_output or jinja2_error to every case.

chat_template_test uses it to decide the cases where @huggingface/jinja is
known to depart from jinja2 (what the models' templates were written for).

    python3 render_jinja2.py chat_template_reference.json
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.exit("render_jinja2.py: Python's jinja2 is not installed (Debian: python3-jinja2)")


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):  # the instant render_reference.mjs pins
    return datetime(2024, 7, 26, 12, 0).strftime(fmt)


def main():
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    compiled = {t["id"]: (env.from_string(t["source"]), t) for t in ref["templates"]}
    for case in ref["cases"]:
        tpl, t = compiled[case["template"]]
        ctx = dict(case["extra"])
        ctx.update(messages=case["messages"], add_generation_prompt=case["add_generation_prompt"],
                   bos_token=t["bos"], eos_token=t["eos"])
        try:
            case["jinja2_output"] = tpl.render(**ctx)
        except Exception as e:  # any failure of the template is a result to compare
            case["jinja2_error"] = f"{type(e).__name__}: {e}"
    ref["jinja2"] = f"jinja2 {jinja2.__version__}"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(ref, f, ensure_ascii=False, indent=1)
    print(f"{path}: added jinja2 {jinja2.__version__} results for {len(ref['cases'])} cases")


if __name__ == "__main__":
    main()
