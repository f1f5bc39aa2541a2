"""The process that renders a model's chat template (run by :mod:`core.prompt.template_sandbox`).

A chat template is code from a downloaded file. It runs here, not in the app: in jinja2's
ImmutableSandboxedEnvironment (no attribute access beyond what the sandbox allows, no
mutation of what it is given), in a process whose address space is capped, whose parent
kills it when a render takes too long, and whose output is counted as it is written.

One request per line on stdin (JSON: template, context, max_chars), one answer per line on
stdout (``{"text": ...}`` or ``{"error": ...}``). It imports only the standard library and
jinja2 (started with ``-I``: the project's modules are not on its path).
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

MEMORY_BYTES = 1 << 30
CACHED = 4  # compiled templates kept (a process serves the models a session opens)


def _raise(message):
    raise jinja2.TemplateError(str(message))


def _tojson(value, indent=None, separators=None, sort_keys=False):
    # as transformers defines it for chat templates: no HTML escaping, non-ASCII kept
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def _environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
    return env


def _render(env, cache, request):
    source = request["template"]
    template = cache.pop(source, None) or env.from_string(source)
    cache[source] = template
    while len(cache) > CACHED:
        cache.pop(next(iter(cache)))
    out, size, limit = [], 0, int(request["max_chars"])
    for chunk in template.generate(**request["context"]):
        size += len(chunk)
        if size > limit:
            return {"error": f"it writes more than {limit:,} characters"}
        out.append(chunk)
    return {"text": "".join(out)}


def _answer(env, cache, line):
    try:
        return _render(env, cache, json.loads(line))
    except SecurityError as e:
        return {"error": f"it reaches outside the sandbox ({e})"}
    except jinja2.TemplateSyntaxError as e:
        return {"error": f"it is not a valid template (line {e.lineno}: {e.message})"}
    except jinja2.TemplateError as e:
        return {"error": f"it stopped: {e}"}
    except MemoryError:
        return {"error": f"it needs more than {MEMORY_BYTES >> 20} MiB"}
    except RecursionError:
        return {"error": "it recurses too deeply"}
    except Exception as e:  # a template's own runtime error (a bad index, a type mix): said, not raised
        return {"error": f"it failed: {type(e).__name__}: {str(e)[:200]}"}


def main():
    try:
        import resource  # why: POSIX only; elsewhere the parent's time limit is the bound
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    env, cache = _environment(), {}
    sys.stdout.write('{"ready": true}\n')  # the parent's time limit counts renders, not this start
    sys.stdout.flush()
    for line in sys.stdin:
        answer = _answer(env, cache, line)
        try:
            sys.stdout.write(json.dumps(answer, ensure_ascii=True) + "\n")
            sys.stdout.flush()
        except MemoryError:
            sys.stdout.write('{"error": "its output needs more memory than it may use"}\n')
            sys.stdout.flush()


if __name__ == "__main__":
    main()
