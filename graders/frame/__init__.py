"""The frame every kata shares: levels, checks and their results, kata declarations, the catalogue of
katas, and the sentences that name a solution's failures.

The bottom of the house. May import: the standard library only (no torch), so the command lines can say
what they know (hints, the list of katas, a stored result) without loading a tensor library.
"""
