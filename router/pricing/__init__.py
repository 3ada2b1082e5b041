"""The router's pricing wing: the per-request path that prices routes and chooses
one (cost model and its corrections, the route price formula and the routes
priced with it, the columnar fast path, interference, scorers, prefix index), compiled as a whole when a build
exists (router/native.py), and the reference decision it must match
(reference.py). Imports nothing from the request wing."""
