// Package samples holds example objects; its test applies them to a real API
// server so they stay valid as the CRDs change.
package samples
