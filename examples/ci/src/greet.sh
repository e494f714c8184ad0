#!/bin/sh
# The "application" this CI pipeline checks, builds and publishes.
greet() {
  printf 'hello, %s\n' "${1:-world}"
}
shout() {
  greet "$@" | tr '[:lower:]' '[:upper:]'
}
