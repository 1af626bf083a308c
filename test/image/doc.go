// Package image tests the image archive `make image` writes and the
// Dockerfile that builds the same image with Docker.
package image
