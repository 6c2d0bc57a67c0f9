"""The meta (outer) learner: inner update on support, loss on query, one outer step."""
