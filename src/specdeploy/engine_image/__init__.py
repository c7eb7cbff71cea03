"""The build phase: engine image profiles and pins, the Dockerfile and its context, drafter checks,
docker build and ship, build-log reading."""
