"""The kata graders (chapter 1: 01-10 on symbolic_trace graphs; chapter 2: 11-13 on ATen graphs), one
package each: kata_<NN_name>/ holds its declaration (`__init__.py`, a module-level `KATA`), its model zoo and hidden-model generator (`models.py`), its mutants (`mutants.py`)
and its manifest (`kata.toml`). Found by name through graders.frame.catalogue.

May import: graders.run (its vocabulary) and nothing else of the graders.
"""
