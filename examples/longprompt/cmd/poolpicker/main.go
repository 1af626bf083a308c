// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command poolpicker is poolpicker with the long-prompt-scorer plugin: the
// whole of what an operator writes to build the picker with a plugin of
// their own.
package main

import (
	"example.com/longprompt"

	"github.com/poolpicker/poolpicker/cmd/poolpicker/app"
)

func main() {
	app.NewCommand(app.WithPlugin(longprompt.Type, longprompt.New)).Main()
}
