"""``scripts/prove_1m_indexer.py`` in parts: :mod:`prove_1m.common` (releases, constants, the
frameworks' top-k), :mod:`prove_1m.stand_ins` (the framework stand-ins), :mod:`prove_1m.finder`
(the import finder), :mod:`prove_1m.run` (inputs, drivers, worker), :mod:`prove_1m.sglang_v41`
(SGLang's DeepSeek-V4.1 passes: inputs, drivers and reference check; their stand-ins in
:mod:`prove_1m.sglang_v41_stand_ins`) and
:mod:`prove_1m.report` (the table). The script's docstring says what the proof runs and measures."""
