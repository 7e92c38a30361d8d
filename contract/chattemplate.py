"""Chat templates: compiled (never rendered) in the environment vLLM renders them in, to refuse a broken one.

vLLM renders a chat template through transformers' `render_jinja_template`: a jinja2
`ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the loop controls (`{% break %}`,
`{% continue %}`) and transformers' `{% generation %}` block. A template compiled in the same environment
here compiles there; one that does not would fail every chat request at run time, so the operator refuses it
(spec.engine.chatTemplate) and the runtime exits at start (--chat-template) with jinja2's line and message.
Compiling parses the template and checks that every filter and test it uses exists; nothing is rendered, so
no code of the template runs.

Only the standard library and jinja2 (a dependency of the operator and of the runtime), like vllmflags.py.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_CACHED = 256  # compile results kept (by template text): the operator checks a spec on every pass


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}...{% endgeneration %}` block (its AssistantTracker), which marks the
    assistant's tokens for training; here only so that a template using it compiles as it does there."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body)
        return call.set_lineno(lineno)

    def _generation_support(self, caller: Any) -> Any:
        return caller()


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, **kwargs: Any) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def environment() -> ImmutableSandboxedEnvironment:
    """transformers' chat-template environment (utils/chat_template_utils.py, _compile_jinja_template)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    return env


@functools.lru_cache(maxsize=MAX_CACHED)
def compile_error(source: str) -> str | None:
    """None when `source` compiles as a chat template; otherwise where and why not, as jinja2 says it:
    `line 3: Encountered unknown tag 'endfor'. ...` (the line within the template)."""
    try:
        environment().compile(source)
    except jinja2.TemplateSyntaxError as exc:  # also TemplateAssertionError: an unknown filter or test
        return f"line {exc.lineno}: {exc.message or type(exc).__name__}"
    except jinja2.TemplateError as exc:
        return f"{type(exc).__name__}: {exc}"
    except RecursionError:
        return "the template is nested too deeply to compile"
    except (SyntaxError, MemoryError) as exc:  # Python's compiler, on the code jinja2 generated
        return f"the template cannot be compiled: {type(exc).__name__}: {exc}"
    return None
