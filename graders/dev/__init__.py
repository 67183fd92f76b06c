"""Tools for the people who write katas: the dev check (is every kata whole?) and mutation testing (does
every level catch its mutants?).

May import: graders.frame, graders.run, graders.katas (by name, through the catalogue).
"""
