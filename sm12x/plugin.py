"""Entry point for the frameworks' official plugin loaders (``vllm.general_plugins``,
``sglang.srt.plugins``), registered by the ``sm12x_plugin-*.dist-info`` folder on the mount.

It covers launchers that skip sitecustomize. It runs the same idempotent install as the
bootstrap, so when both routes fire nothing is applied twice. vLLM does not catch exceptions raised
by plugin functions, so this one catches everything (except under SM12X_STRICT=1).
"""


def register():
    import os

    try:
        import sm12x

        sm12x.install()
    except Exception as e:
        if os.environ.get("SM12X_STRICT") == "1":
            raise
        import sys

        print(f"sm12x: plugin install failed: {type(e).__name__}: {e}", file=sys.stderr)
