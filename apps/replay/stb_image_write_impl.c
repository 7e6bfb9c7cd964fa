/* The one translation unit that holds stb_image_write's implementation (Debian's libstb-dev
   ships the header). */
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
