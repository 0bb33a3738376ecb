"""``acklane test``'s harness: a pipeline's test cases run through its watchers.

Above the pipeline it drives and below the command line: ``cases`` (the case files'
format, loading them, judging what happened against what was expected) and ``run``
(each case's message through the pipeline's watchers on the in-process broker, no
store needed). ``acklane.core.testing`` and ``acklane test`` are its callers.
"""
