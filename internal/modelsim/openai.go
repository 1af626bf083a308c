// Copyright 2026 The poolpicker Authors.
// Licensed under the Apache License, Version 2.0; see the LICENSE file.

package modelsim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// apiError is an OpenAI-style error answer.
type apiError struct {
	code int
	typ  string
	msg  string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.code, e.typ, e.msg) }

func badRequest(format string, args ...any) *apiError {
	return &apiError{code: http.StatusBadRequest, typ: "BadRequestError", msg: fmt.Sprintf(format, args...)}
}

// errorBody is the JSON an error is answered with, in the shape of OpenAI's
// (and current vLLM's) error responses.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// inferenceRequest is the part of a completions or chat-completions body the
// simulator uses; other fields are accepted and ignored.
type inferenceRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage *bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parsedRequest is a validated request.
type parsedRequest struct {
	chat  bool
	model string
	// prompt is the text the model reads: the completion prompt, or the chat
	// messages rendered through a chat template.
	prompt       []byte
	promptTokens int
	// maxTokens is the output limit; explicit says the client set it.
	maxTokens    int
	explicit     bool
	stream       bool
	includeUsage bool
}

// parseRequest decodes and validates a body for the given endpoint.
func parseRequest(body []byte, chat bool, defaultMaxTokens int) (*parsedRequest, *apiError) {
	var in inferenceRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&in); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("invalid JSON body: trailing data after the request object")
	}
	if in.Model == "" {
		return nil, badRequest("the \"model\" field is required")
	}
	p := &parsedRequest{chat: chat, model: in.Model, stream: in.Stream, includeUsage: true}
	if in.StreamOptions != nil && in.StreamOptions.IncludeUsage != nil {
		p.includeUsage = *in.StreamOptions.IncludeUsage
	}
	var err *apiError
	if chat {
		p.prompt, err = renderChat(in.Messages)
	} else {
		p.prompt, err = completionPrompt(in.Prompt)
	}
	if err != nil {
		return nil, err
	}
	p.promptTokens = (len(p.prompt) + BytesPerToken - 1) / BytesPerToken
	if p.promptTokens == 0 {
		return nil, badRequest("the prompt is empty")
	}
	limit := in.MaxTokens
	name := "max_tokens"
	if in.MaxCompletionTokens != nil {
		limit, name = in.MaxCompletionTokens, "max_completion_tokens"
	}
	p.maxTokens = defaultMaxTokens
	if limit != nil {
		if *limit < 1 {
			return nil, badRequest("%s must be at least 1, got %d", name, *limit)
		}
		p.maxTokens, p.explicit = *limit, true
	}
	return p, nil
}

// completionPrompt accepts a string, a list of one string, or a list of token
// ids (4 bytes per id in the prompt, so each id counts as one token).
func completionPrompt(raw json.RawMessage) ([]byte, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("the \"prompt\" field is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s), nil
	}
	var list []string
	if json.Unmarshal(raw, &list) == nil {
		if len(list) != 1 {
			return nil, badRequest("the simulator serves one prompt per request, got %d", len(list))
		}
		return []byte(list[0]), nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		b := make([]byte, 4*len(ids))
		for i, id := range ids {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(id))
		}
		return b, nil
	}
	return nil, badRequest("\"prompt\" must be a string, a list of one string or a list of token ids")
}

// renderChat applies a ChatML-like template, so the same conversation always
// gives the same prompt bytes and a longer conversation extends a shorter
// one's prefix.
func renderChat(msgs []chatMessage) ([]byte, *apiError) {
	if len(msgs) == 0 {
		return nil, badRequest("the \"messages\" field is required and must not be empty")
	}
	var b bytes.Buffer
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages[%d]: the \"role\" field is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, badRequest("messages[%d].content: %v", i, err)
		}
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(text)
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	return b.Bytes(), nil
}

// messageText reads a message content: a string, null, or a list of parts of
// which the text parts are joined.
func messageText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("must be a string or a list of content parts")
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			sb.WriteString(p.Text)
		}
	}
	return sb.String(), nil
}

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	PromptTokensDetails *promptDetail `json:"prompt_tokens_details,omitempty"`
}

type promptDetail struct {
	CachedTokens int `json:"cached_tokens"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatContent `json:"message,omitempty"`
	Delta        *chatContent `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type chatContent struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

// response is a whole response or one streamed chunk of either endpoint.
type response struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices any    `json:"choices"`
	Usage   *usage `json:"usage,omitempty"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}
