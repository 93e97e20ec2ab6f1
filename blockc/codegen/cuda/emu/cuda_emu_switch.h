// cuda_emu_switch.h: the context switch of the emulator's fiber mode and the
// stack a new fiber starts on. cuda_emu_fibers.cpp runs a block's threads on
// them; bench/emu_context_switch.cpp times this same switch against the
// alternatives (the figures are in cuda_emu.h).
//
// The switch saves the callee-saved registers, MXCSR and the x87 control word
// on the old stack, swaps rsp, and restores them from the new one. A new
// fiber's stack is laid out as if it had called blockc_emu_switch; its
// "return" lands in blockc_emu_fiber_start, which calls r13(r12) with an
// aligned stack.
//
// The assembly below defines the two functions, so exactly one translation
// unit of a program includes this header.
#pragma once

#include <cstdint>
#include <cstring>

asm(R"(
    .text
    .p2align 4
    .globl blockc_emu_switch
    .hidden blockc_emu_switch
    .type blockc_emu_switch,@function
blockc_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size blockc_emu_switch,.-blockc_emu_switch
    .globl blockc_emu_fiber_start
    .hidden blockc_emu_fiber_start
    .type blockc_emu_fiber_start,@function
blockc_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size blockc_emu_fiber_start,.-blockc_emu_fiber_start
)");
// Saves the running context's stack pointer in *save_sp and resumes the one at load_sp.
extern "C" void blockc_emu_switch(void** save_sp, void* load_sp);
extern "C" void blockc_emu_fiber_start();

// The stack pointer of a fiber that, when first switched to, runs fn(arg) on
// the stack that ends at `top`, with the caller's floating-point modes. fn
// must never return: it ends by switching away for the last time.
template <class T>
void* blockc_emu_fiber_stack(char* top, void (*fn)(T*), T* arg) {
  unsigned ctrl[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(ctrl[0]), "=m"(ctrl[1]));
  void** sp = (void**)((uintptr_t)top & ~(uintptr_t)15);
  *--sp = (void*)blockc_emu_fiber_start;  // "return" address: rsp is 16-aligned after it
  *--sp = nullptr;                        // rbp
  *--sp = nullptr;                        // rbx
  *--sp = (void*)arg;                     // r12: the argument
  *--sp = (void*)fn;                      // r13: the function
  *--sp = nullptr;                        // r14
  *--sp = nullptr;                        // r15
  --sp;
  std::memcpy(sp, ctrl, 4);                 // MXCSR
  std::memcpy((char*)sp + 4, &ctrl[1], 2);  // x87 control word
  return sp;
}
