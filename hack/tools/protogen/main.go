// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

// Command protogen generates the Go code of poolpicker's .proto files without
// protoc: it compiles them with protocompile, runs protoc-gen-go's generator
// in process, and runs protoc-gen-go-grpc (built from this module's pinned
// version, -grpc-plugin) as protoc would.
//
//	go run . -root ../../.. -grpc-plugin BIN peersync/internal/wirepb/peersync.proto
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/bufbuild/protocompile"
	gengo "google.golang.org/protobuf/cmd/protoc-gen-go/internal_gengo"
	"google.golang.org/protobuf/compiler/protogen"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	root := flag.String("root", ".", "directory the .proto paths are relative to, and the Go files are written under")
	grpcPlugin := flag.String("grpc-plugin", "", "path of a protoc-gen-go-grpc binary; empty: no service code")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "protogen: name the .proto files to generate")
		os.Exit(2)
	}
	if err := run(*root, *grpcPlugin, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "protogen:", err)
		os.Exit(1)
	}
}

func run(root, grpcPlugin string, files []string) error {
	req, err := request(root, files)
	if err != nil {
		return err
	}
	resp, err := generateGo(req)
	if err != nil {
		return err
	}
	if err := write(root, resp); err != nil {
		return err
	}
	if grpcPlugin == "" {
		return nil
	}
	if resp, err = runPlugin(grpcPlugin, req); err != nil {
		return err
	}
	return write(root, resp)
}

// request compiles files and makes the request protoc would send a plugin.
func request(root string, files []string) (*pluginpb.CodeGeneratorRequest, error) {
	c := protocompile.Compiler{
		Resolver:       protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{root}}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	compiled, err := c.Compile(context.Background(), files...)
	if err != nil {
		return nil, err
	}
	req := &pluginpb.CodeGeneratorRequest{FileToGenerate: files, Parameter: proto.String("paths=source_relative")}
	seen := map[string]bool{}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if seen[fd.Path()] {
			return
		}
		seen[fd.Path()] = true
		for i := 0; i < fd.Imports().Len(); i++ {
			add(fd.Imports().Get(i).FileDescriptor)
		}
		req.ProtoFile = append(req.ProtoFile, protodesc.ToFileDescriptorProto(fd))
	}
	for _, f := range compiled {
		add(f)
	}
	return req, nil
}

// generateGo is protoc-gen-go's answer to req.
func generateGo(req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, error) {
	gen, err := protogen.Options{}.New(req)
	if err != nil {
		return nil, err
	}
	for _, f := range gen.Files {
		if f.Generate {
			gengo.GenerateFile(gen, f)
		}
	}
	gen.SupportedFeatures = gengo.SupportedFeatures
	gen.SupportedEditionsMinimum, gen.SupportedEditionsMaximum = descriptorpb.Edition_EDITION_PROTO2, descriptorpb.Edition_EDITION_2023
	return gen.Response(), nil
}

// runPlugin runs the plugin binary at path on req.
func runPlugin(path string, req *pluginpb.CodeGeneratorRequest) (*pluginpb.CodeGeneratorResponse, error) {
	in, err := proto.Marshal(req)
	if err != nil {
		return nil, err
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", path, err, stderr.String())
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(out.Bytes(), &resp); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &resp, nil
}

// write writes resp's files under root.
func write(root string, resp *pluginpb.CodeGeneratorResponse) error {
	if resp.Error != nil {
		return errors.New(resp.GetError())
	}
	for _, f := range resp.File {
		path := filepath.Join(root, f.GetName())
		if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}
