"""`reconciler agent`: a node agent on another machine, dialing out to `reconciler serve`."""
