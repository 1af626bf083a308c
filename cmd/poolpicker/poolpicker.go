// Command poolpicker is an Endpoint Picker for the Gateway API Inference
// Extension that serves many InferencePools from one process.
package main

import "github.com/poolpicker/poolpicker/cmd/poolpicker/app"

func main() { app.Main() }
