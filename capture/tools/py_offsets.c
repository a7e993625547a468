/* Prints the CPython offsets capture/src/python/layouts.rs uses, as the C
 * compiler sees them in one interpreter's installed headers, to check the
 * hand-written tables against (and to start a table for a new version).
 *
 *   P=/path/to/python3.X; inc=$($P -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
 *   lib=$($P -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
 *   gcc -I$inc -I$inc/internal capture/tools/py_offsets.c -L$lib -lpython3.X -o /tmp/off
 *   LD_LIBRARY_PATH=$lib /tmp/off
 */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_VERSION_HEX >= 0x030B0000
#include "internal/pycore_frame.h"
#else
#include <frameobject.h>
#endif
#if PY_VERSION_HEX >= 0x030D0000
#include "internal/pycore_runtime.h"
#endif

#define P(s, f) printf("%-22s %-20s %zu\n", #s, #f, offsetof(s, f))

int main(void) {
    printf("version %s\n", PY_VERSION);
    P(PyObject, ob_type);
    P(PyVarObject, ob_size);
    P(PyBytesObject, ob_sval);
    P(PyTypeObject, tp_basicsize);
    P(PyTypeObject, tp_itemsize);
    printf("sizeof PyASCIIObject %zu, PyCompactUnicodeObject %zu, PyUnicodeObject %zu\n", sizeof(PyASCIIObject),
           sizeof(PyCompactUnicodeObject), sizeof(PyUnicodeObject));
    P(PyASCIIObject, length);
    P(PyASCIIObject, state);
    printf("sizeof PyCodeObject %zu\n", sizeof(PyCodeObject));
    P(PyCodeObject, co_firstlineno);
    P(PyCodeObject, co_filename);
    P(PyCodeObject, co_name);
    P(PyCodeObject, co_linetable);
#if PY_VERSION_HEX >= 0x030B0000
    P(PyCodeObject, co_qualname);
    P(PyCodeObject, _co_firsttraceable);
    P(PyCodeObject, co_code_adaptive);
#endif
#if PY_VERSION_HEX < 0x030B0000
    printf("sizeof PyFrameObject %zu\n", sizeof(PyFrameObject));
    P(PyThreadState, frame);
    P(PyFrameObject, f_back);
    P(PyFrameObject, f_code);
    P(PyFrameObject, f_lasti);
#elif PY_VERSION_HEX < 0x030D0000
    P(PyThreadState, cframe);
    P(_PyCFrame, current_frame);
    P(_PyInterpreterFrame, f_code);
    P(_PyInterpreterFrame, previous);
    P(_PyInterpreterFrame, prev_instr);
    P(_PyInterpreterFrame, owner);
#else
    P(PyThreadState, current_frame);
    P(_PyInterpreterFrame, f_executable);
    P(_PyInterpreterFrame, previous);
    P(_PyInterpreterFrame, instr_ptr);
    P(_PyInterpreterFrame, owner);
    {
        /* What the running library publishes, and where in _Py_DebugOffsets. */
        const _Py_DebugOffsets *d = &_PyRuntime.debug_offsets;
        printf("debug_offsets sizeof %zu, thread_state at %zu, code_object at %zu, unicode_object at %zu\n",
               sizeof(_Py_DebugOffsets), offsetof(_Py_DebugOffsets, thread_state),
               offsetof(_Py_DebugOffsets, code_object), offsetof(_Py_DebugOffsets, unicode_object));
        printf("cookie %.8s version %#llx free_threaded %llu\n", d->cookie, (unsigned long long)d->version,
               (unsigned long long)d->free_threaded);
        printf("thread_state size %llu current_frame %llu\n", (unsigned long long)d->thread_state.size,
               (unsigned long long)d->thread_state.current_frame);
        printf("interpreter_frame size %llu previous %llu executable %llu instr_ptr %llu localsplus %llu owner %llu\n",
               (unsigned long long)d->interpreter_frame.size, (unsigned long long)d->interpreter_frame.previous,
               (unsigned long long)d->interpreter_frame.executable, (unsigned long long)d->interpreter_frame.instr_ptr,
               (unsigned long long)d->interpreter_frame.localsplus, (unsigned long long)d->interpreter_frame.owner);
        printf("code_object size %llu filename %llu name %llu qualname %llu linetable %llu firstlineno %llu "
               "co_code_adaptive %llu\n",
               (unsigned long long)d->code_object.size, (unsigned long long)d->code_object.filename,
               (unsigned long long)d->code_object.name, (unsigned long long)d->code_object.qualname,
               (unsigned long long)d->code_object.linetable, (unsigned long long)d->code_object.firstlineno,
               (unsigned long long)d->code_object.co_code_adaptive);
        printf("pyobject size %llu ob_type %llu; bytes size %llu ob_size %llu ob_sval %llu\n",
               (unsigned long long)d->pyobject.size, (unsigned long long)d->pyobject.ob_type,
               (unsigned long long)d->bytes_object.size, (unsigned long long)d->bytes_object.ob_size,
               (unsigned long long)d->bytes_object.ob_sval);
        printf("unicode size %llu state %llu length %llu asciiobject_size %llu\n",
               (unsigned long long)d->unicode_object.size, (unsigned long long)d->unicode_object.state,
               (unsigned long long)d->unicode_object.length, (unsigned long long)d->unicode_object.asciiobject_size);
    }
#endif
    return 0;
}
