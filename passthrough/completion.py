"""Shell completion scripts generated from the argparse tree (no extra dependency)."""

from __future__ import annotations

import argparse


def _tree(parser: argparse.ArgumentParser) -> dict[str, tuple[list[str], dict[str, object]]]:
    """path ("", "scan", "sample build") → (options, subcommands)."""
    out: dict[str, tuple[list[str], dict[str, object]]] = {}

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        opts: list[str] = []
        subs: dict[str, object] = {}
        for action in p._actions:
            opts.extend(o for o in action.option_strings if o.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    subs[name] = child
                    walk(child, f"{path} {name}".strip())
        out[path] = (opts, subs)

    walk(parser, "")
    return out


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    tree = _tree(parser)
    cases = []
    for path, (opts, subs) in sorted(tree.items()):
        words = " ".join(sorted(subs) + sorted(set(opts)))
        cases.append(f'        "{path}") words="{words}" ;;')
    body = "\n".join(cases)
    bash = f"""# bash completion for passthrough; load with: eval "$(passthrough completion bash)"
_passthrough() {{
    local cur path="" w i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ $w == -* ]] && continue
        case "${{path:+$path }}$w" in
{chr(10).join(f'            "{p}") path="{p}" ;;' for p in sorted(tree) if p)}
        esac
    done
    local words=""
    case "$path" in
{body}
    esac
    if [[ $cur == --root=* || ${{COMP_WORDS[COMP_CWORD-1]}} == --root || ${{COMP_WORDS[COMP_CWORD-1]}} == -o ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -F _passthrough passthrough
"""
    if shell == "bash":
        return bash
    return "# zsh completion for passthrough: autoload -U bashcompinit && bashcompinit first\n" + (
        "autoload -U +X bashcompinit && bashcompinit\n" + bash
    )
